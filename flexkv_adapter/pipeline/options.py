"""Options of :func:`~flexkv_adapter.adapt` and how they combine with the pool's own metadata."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypedDict

import torch

from ..config.integers import LIMIT, bounded_integer
from ..config.problems import did_you_mean
from ..errors import AdapterError, InconsistentLayersError, NotAddressableError
from ..model.axes import AxesLike, Axis, parse_axes
from ..model.layout import Geometry, ViewKind
from ..readers.containers import attr_owners, probe, probe_int
from ..text import short_repr


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
_POOL_INTS = ("layer_num", "head_num", "head_dim", "v_head_dim", "page_size", "start_layer")
_POOL_MINIMUM = {"page_size": 1, "start_layer": 0}  # pool metadata that is used, not only matched


def _int(name: str, value: object, minimum: int) -> int:
    """An integer (numpy and 0-d tensor integers too, via ``__index__``); never a bool or a float."""
    return bounded_integer(value, name, minimum, LIMIT)


def _choice(*allowed: str) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        if value not in allowed:
            raise AdapterError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {short_repr(value)}")
        return value  # type: ignore[return-value]

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
    from ..readers.spec import LayoutSpec

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


def validate_options(options: Mapping[str, Any], page_size: object = None) -> dict[str, Any]:
    """The options with each value checked and normalised once (``None`` means not given).

    Booleans are never integers, sequences become lists, ``axes`` is parsed; anything else is an
    :class:`AdapterError` naming the option.
    """
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        known = sorted(KNOWN_OPTIONS | {"page_size"})  # page_size is adapt()'s own keyword, an option all the same
        named = ", ".join(f"{name!r}{did_you_mean(name, known)}" for name in sorted(unknown))
        raise AdapterError(f"unknown adapt() option(s) {named}; known: {known}")
    checked = {name: _CHECKS[name](name, value) for name, value in options.items() if value is not None}
    if page_size is not None:
        checked["page_size"] = _int("page_size", page_size, 1)
    return checked


def _pool_kv_dim(pool: object, prefix: str) -> tuple[int | None, str]:
    if (dim := probe_int(pool, "kv_cache_dim")) is not None:
        return dim, f"{prefix}kv_cache_dim"
    rank, rope = probe_int(pool, "kv_lora_rank"), probe_int(pool, "qk_rope_head_dim")
    if rank is not None and rope is not None:
        return rank + rope, f"{prefix}kv_lora_rank + {prefix}qk_rope_head_dim"
    return None, ""


def _owner_facts(owner: object, prefix: str, logical: object) -> dict[str, tuple[int | None, str]]:
    """One metadata owner's integer facts, each with where it came from."""
    facts = {n: (probe_int(owner, n), f"{prefix}{n}") for n in _POOL_INTS}
    facts["kv_dim"] = _pool_kv_dim(owner, prefix)
    if isinstance(logical, torch.dtype) and str(logical).endswith("_x2"):
        # Packed dtypes (FP4 as float4_e2m1fn_x2) store two values per element: the buffers'
        # last dim is half the pool's head dims.
        for name in ("head_dim", "v_head_dim", "kv_dim"):
            value, origin = facts[name]
            if value is not None:
                facts[name] = (value // 2, f"{origin} / 2 ({logical} packs two values per element)")
    return facts


def _prefix(path: str) -> str:
    return f"pool.{path}." if path else "pool."


def owners_fact(pool: object, owners: list[tuple[str, object]], name: str) -> tuple[object, str]:
    """A descriptive attribute (``dtype``, ``store_dtype``, ``kv_cache_layout``) of every attrs= owner, and where
    it was read: owners that disagree are an error, never one of them chosen silently. A tensor's own dtype
    describes nothing."""
    found = [
        (v, f"{_prefix(p)}{name}")
        for p, o in owners
        if not isinstance(o, torch.Tensor) and (v := probe(o, name)) is not None
    ]
    for value, origin in found[1:]:
        try:
            differ = bool(value != found[0][0])
        except Exception:  # values that cannot even be compared (tensors of several elements) do not agree
            differ = True
        if differ:
            raise InconsistentLayersError(
                f"{type(pool).__name__}: {found[0][1]}={short_repr(found[0][0])} but {origin}={short_repr(value)}; "
                f"the attributes named by attrs= belong to pools that disagree"
            )
    return found[0] if found else (None, f"pool.{name}")


def _merged_facts(pool: object, owners: list[tuple[str, object]]) -> dict[str, tuple[int, str]]:
    """The facts of every owner of the named attributes; two owners that disagree are an error."""
    merged: dict[str, tuple[int, str]] = {}
    for path, owner in owners:
        logical = None if isinstance(owner, torch.Tensor) else probe(owner, "dtype")
        for name, (value, origin) in _owner_facts(owner, _prefix(path), logical).items():
            if value is None:
                continue
            if name in merged and merged[name][0] != value:
                raise InconsistentLayersError(
                    f"{type(pool).__name__}: {merged[name][1]}={merged[name][0]} but {origin}={value}; the "
                    f"attributes named by attrs= belong to pools that disagree"
                )
            merged.setdefault(name, (value, origin))
    return merged


def resolve_geometry(pool: object, page_size: int | None, options: AdaptOptions) -> Geometry:
    """Merge options with the pool's metadata; an option that contradicts the pool is an error."""
    given = validate_options(options, page_size)
    facts: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    owners = attr_owners(pool, given.get("attrs"))  # attrs= owners' metadata is read like a top-level pool's
    for name, (value, origin) in _merged_facts(pool, owners).items():
        if value < _POOL_MINIMUM.get(name, value) or value >= LIMIT:  # 0 divides by zero, a negative trims up
            raise InconsistentLayersError(
                f"{type(pool).__name__}: {origin}={value} is out of range (must be >= {_POOL_MINIMUM.get(name, 0)} "
                f"and below 2**40); fix the pool metadata"
            )
        if name in given and given[name] != value:
            raise InconsistentLayersError(
                f"{type(pool).__name__}: option {name}={given[name]!r} contradicts {origin}={value}; "
                f"drop the option or fix the pool metadata"
            )
        facts[name] = value
        sources.append((name, origin))
    (logical, where), (stored, _) = owners_fact(pool, owners, "dtype"), owners_fact(pool, owners, "store_dtype")
    if isinstance(logical, torch.dtype) and given.get("dtype", logical) not in (logical, stored):
        raise InconsistentLayersError(
            f"{type(pool).__name__}: option dtype={given['dtype']} contradicts {where}={logical}"
            f"{f' (store_dtype={stored})' if isinstance(stored, torch.dtype) else ''}; drop the option or fix the pool"
        )
    facts.update(given)
    kind = facts.get("kind")
    axes: tuple[Axis, ...] | None = given.get("axes")
    layout, _ = owners_fact(pool, owners, "kv_cache_layout")  # SGLang MHA pools: "nhd" | "hnd" | "vectorized_5d"
    if axes is None and layout == "hnd":
        axes, kind = parse_axes("P H T D"), kind or "mha"
    elif axes is None and layout == "vectorized_5d":
        raise NotAddressableError(
            f"{type(pool).__name__}: kv_cache_layout='vectorized_5d' (ROCm AITER) packs K as "
            f"[blocks, heads, dim/X, page, X]; no per-layer [rows, heads, dim] view exists. Fix: run the engine "
            f"with the NHD layout (unset SGLANG_AITER_KV_CACHE_LAYOUT)"
        )
    return Geometry(
        layer_num=facts.get("layer_num"),
        head_num=facts.get("head_num"),
        head_dim=facts.get("head_dim"),
        v_head_dim=facts.get("v_head_dim"),
        kv_dim=facts.get("kv_dim"),
        page_size=facts.get("page_size"),
        start_layer=facts.get("start_layer", 0),
        kind=kind,
        axes=axes,
        attrs=tuple(given["attrs"]) if "attrs" in given else None,
        layer_ids=tuple(given["layer_ids"]) if "layer_ids" in given else None,
        dtype=given.get("dtype"),
        sources=tuple(sources),
        given=frozenset(given),
    )
