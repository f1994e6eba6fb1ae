"""Options of :func:`~flexkv_adapter.adapt`, checked: the caller's and a spec's or plugin's alike.

How they combine with the pool's own metadata is :mod:`~flexkv_adapter.pipeline.metadata`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypedDict

import torch

from ..config.integers import LIMIT, bounded_integer
from ..config.problems import close_names
from ..errors import AdapterError
from ..model.axes import AxesLike, Axis, parse_axes
from ..model.layout import ViewKind
from ..text import short_repr
from .spec import LayoutSpec


class AdaptOptions(TypedDict, total=False):
    """Keyword options of :func:`~flexkv_adapter.adapt`; each settles one fact about the pool.

    kind: "mha" or "mla", when the tensors alone cannot tell.
    axes: the meaning of each tensor axis, e.g. "L KV N H D" (see :class:`~flexkv_adapter.Axis`).
    attrs: the attribute name(s) or dotted paths to read: one (K and V together, or MLA) or two (K, V).
    layer_num, head_num, head_dim, v_head_dim, kv_dim: geometry the tensors must match.
    start_layer: global id of the first layer (pipeline stages; refused for dicts, whose names give
    ids); layer_ids: explicit ids, for a dict in the dict's order (they must agree with its names).
    dtype: expose the bytes as this dtype (zero-copy); for a 1-D byte buffer, its element type.
    shape, offset: the declared geometry of a 1-D byte buffer (offset in bytes).
    spec: a :class:`~flexkv_adapter.readers.spec.LayoutSpec`, a dict, or a YAML path describing the layout.
    hybrid: "error" (default, or ``FLEXKV_ADAPTER_HYBRID``) or "attention_only" for hybrid pools.
    """

    kind: ViewKind
    axes: AxesLike
    attrs: Sequence[str]
    layer_num: int
    head_num: int
    head_dim: int
    v_head_dim: int
    kv_dim: int
    start_layer: int
    layer_ids: Sequence[int]
    dtype: torch.dtype
    shape: Sequence[int]
    offset: int
    spec: Any
    hybrid: Literal["error", "attention_only"]


KNOWN_OPTIONS = frozenset(AdaptOptions.__annotations__)


def _int(name: str, value: object, minimum: int) -> int:
    """An integer (numpy and 0-d tensor integers too, via ``__index__``); never a bool or a float."""
    return bounded_integer(value, name, minimum, LIMIT)


def _choice(*allowed: str) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        # a plain str read off the value's own characters: an array, or a str subclass whose == raises or lies,
        # is judged by what it holds, never by its methods
        plain = str.__add__("", value) if isinstance(value, str) else None
        if plain not in allowed:
            raise AdapterError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {short_repr(value)}")
        return plain  # type: ignore[return-value]

    return check


def _ints(name: str, value: object, minimum: int) -> list[int]:
    if not isinstance(value, (list, tuple)) or not value:
        raise AdapterError(f"{name} must be a non-empty list of integers, got {short_repr(value)}")
    return [_int(f"{name}[{i}]", v, minimum) for i, v in enumerate(value)]


def _layer_ids(name: str, value: object) -> list[int]:
    ids = _ints(name, value, 0)
    if len(set(ids)) != len(ids):
        raise AdapterError(f"{name} names a layer twice: {short_repr(value)}")
    return ids


def _shape(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise AdapterError(f"{name} must be a non-empty list of sizes (one may be -1), got {short_repr(value)}")
    dims = tuple(_int(f"{name}[{i}]", v, -1) for i, v in enumerate(value))
    if 0 in dims:
        raise AdapterError(f"{name}={short_repr(value)}: sizes must be positive (or one -1)")
    if dims.count(-1) > 1:
        raise AdapterError(f"{name}={short_repr(value)} may hold at most one -1")
    return dims


def _attrs(name: str, value: object) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or len(names) not in (1, 2):
        raise AdapterError(f"{name} takes one or two attribute names, got {short_repr(value)}")
    for n in names:
        if not isinstance(n, str) or not all(part.isidentifier() for part in n.split(".")):
            raise AdapterError(
                f"{name}: {short_repr(n)} is not an attribute name or dotted path (e.g. 'pool.k_buffer')"
            )
    return list(names)


def _axes(name: str, value: object) -> tuple[Axis, ...]:
    ok = isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value))
    try:
        if not ok:
            raise ValueError(f"expected a string like 'L KV N H D' or a list of axis names, got {short_repr(value)}")
        return parse_axes(value)  # type: ignore[arg-type]
    except ValueError as exc:
        raise AdapterError(f"invalid axes option: {exc}") from None


def _dtype(name: str, value: object) -> torch.dtype:
    if not isinstance(value, torch.dtype):
        raise AdapterError(f"{name} must be a torch.dtype (e.g. torch.bfloat16), got {short_repr(value)}")
    return value


def _spec(name: str, value: object) -> object:
    if not isinstance(value, (LayoutSpec, Mapping, str, os.PathLike)):
        raise AdapterError(f"{name} must be a LayoutSpec, a dict or a YAML path, got {short_repr(value)}")
    return value


_CHECKS: dict[str, Callable[[str, object], object]] = {
    **{n: lambda n, v: _int(n, v, 1) for n in ("layer_num", "head_num", "head_dim", "v_head_dim", "kv_dim")},
    "page_size": lambda n, v: _int(n, v, 1),
    "start_layer": lambda n, v: _int(n, v, 0),
    "offset": lambda n, v: _int(n, v, 0),
    "kind": _choice("mha", "mla"),
    "hybrid": _choice("error", "attention_only"),
    "layer_ids": _layer_ids,
    "shape": _shape,
    "attrs": _attrs,
    "axes": _axes,
    "dtype": _dtype,
    "spec": _spec,
}


_PLAN_OWN = frozenset({"tp_size", "model_config", "total_kv_heads", "model_dtype"})
ENTRY_KEYWORDS: dict[str, frozenset[str]] = {  # each entry point takes the ones before it: plan(adapt(...))
    "adapt": KNOWN_OPTIONS | {"page_size"},
    "plan": KNOWN_OPTIONS | {"page_size"} | _PLAN_OWN,
    "register": KNOWN_OPTIONS | {"page_size"} | _PLAN_OWN | {"override_device_id", "attempts", "interval_s"},
}


def check_keywords(names: Iterable[str], entry: str) -> None:
    """Refuse keywords ``entry``() does not take; the suggestion looks through every entry point's keywords
    and says which one takes it, so ``plan(..., attempt=3)`` points at register()'s ``attempts``."""
    unknown = sorted(set(names) - ENTRY_KEYWORDS[entry])
    if not unknown:
        return
    everyone = sorted(set().union(*ENTRY_KEYWORDS.values()))

    def hint(name: str) -> str:
        if name in everyone:
            return f" (a {_first_taker(name)}() keyword)"
        found = close_names(name, everyone)
        if not found:
            return ""
        takers = [k + ("" if k in ENTRY_KEYWORDS[entry] else f", a {_first_taker(k)}() keyword") for k in found]
        return f" (did you mean {' or '.join(takers)}?)"

    named = ", ".join(f"{name!r}{hint(name)}" for name in unknown)
    raise AdapterError(f"unknown {entry}() keyword(s) {named}; {entry}() takes: {sorted(ENTRY_KEYWORDS[entry])}")


def _first_taker(keyword: str) -> str:
    return next(entry for entry, names in ENTRY_KEYWORDS.items() if keyword in names)


def validate_options(options: Mapping[str, Any], page_size: object = None) -> dict[str, Any]:
    """The options with each value checked and normalised once (``None`` means not given).

    Booleans are never integers, sequences become lists, ``axes`` is parsed; anything else is an
    :class:`AdapterError` naming the option.
    """
    check_keywords(options, "adapt")
    checked = {name: _CHECKS[name](name, value) for name, value in options.items() if value is not None}
    if page_size is not None:
        checked["page_size"] = _int("page_size", page_size, 1)
    return checked
