"""Guarded attribute probing: the one place recognition and hybrid detection read a pool's attributes.

Pools are arbitrary objects. A property may raise (SGLang asserts a feature is enabled), a
``__getattr__`` may recurse, a dotted path may cross a ``None``. Reading them here turns every such
failure into an :class:`~flexkv_adapter.errors.AdapterError` that names the attribute, instead of a
traceback from deep inside recognition.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..config.integers import looks_numeric, read_integer
from ..errors import AdapterError, InconsistentLayersError

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def probe(obj: object, name: str, *, tolerate: bool = False) -> Any:
    """``getattr(obj, name, None)``; an attribute that raises is an AdapterError (or None if ``tolerate``)."""
    try:
        return getattr(obj, name, None)
    except Exception as exc:  # RecursionError included: a recursive __getattr__
        if tolerate:
            return None
        raise AdapterError(
            f"{type(obj).__name__}.{name} raised {type(exc).__name__} when read: {str(exc)[:200]}; "
            f"fix the pool's attribute, or name the KV tensors with attrs=[...]"
        ) from None


def probe_path(obj: object, path: str) -> Any:
    """``probe`` along a dotted path (``full_kv_pool.k_buffer``); None if any step is missing."""
    for part in path.split("."):
        obj = probe(obj, part)
        if obj is None:
            return None
    return obj


def attr_owners(pool: object, attrs: Sequence[str] | None) -> list[tuple[str, object]]:
    """(path, object) of each object holding a named attribute (``pool.inner`` for ``inner.k_buffer``).

    Its metadata describes those tensors, as a top-level pool's describes its own; no attrs: the pool.
    """
    paths = sorted({a.rpartition(".")[0] for a in attrs or ()}) or [""]
    return [(p, probe_path(pool, p) if p else pool) for p in paths]


def probe_int(obj: object, name: str) -> int | None:
    """An integer attribute, read by :func:`~flexkv_adapter.config.integers.read_integer` (numpy and 0-d tensor
    integers too); None if absent or not a number at all. A number that is not an integer (a bool, a float,
    a meta tensor) is malformed metadata: an AdapterError, never silently ignored."""
    value = probe(obj, name)
    if value is None or not looks_numeric(value):
        return None
    return read_integer(value, f"{type(obj).__name__}.{name}", InconsistentLayersError)


def storage_problem(t: torch.Tensor) -> str | None:
    """Why ``t`` has no real memory FlexKV could copy (meta, fake, sparse, empty), or None if it has."""
    plain = type(t) in _PLAIN
    if plain and not t.is_meta and not t.is_nested and t.layout is torch.strided:
        n = t.numel()  # the common case: a dense, contiguous tensor inside the memory behind it
        if n and t.is_contiguous() and (t.storage_offset() + n) * t.element_size() <= t.untyped_storage().nbytes():
            return None
    if t.is_nested:  # strided nested tensors have no sizes: .shape raises
        return "is a nested tensor; FlexKV copies dense tensors of one shape"
    if t.layout is not torch.strided:
        return f"is a {str(t.layout).removeprefix('torch.')} tensor; FlexKV copies dense (strided) memory"
    if t.is_meta:
        return "is on the meta device: it has a shape but no memory"
    if t.numel() == 0:
        return f"is empty (shape {tuple(t.shape)})"
    try:  # subclasses (FakeTensor, functional wrappers) may warn or raise when asked for memory
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            address = t.untyped_storage().data_ptr()
    except Exception as exc:
        return f"has no accessible storage ({type(exc).__name__}: {str(exc)[:120]})"
    if address == 0 and t.untyped_storage().nbytes():
        return f"has no memory behind it (a {type(t).__name__} without storage, e.g. a FakeTensor)"
    return _extent_problem(t)


def _extent_problem(t: torch.Tensor) -> str | None:
    """Why the view reaches past its storage (resized or freed after the view was made), or None."""
    try:
        nbytes, item, offset = t.untyped_storage().nbytes(), t.element_size(), t.storage_offset()
        if t.is_contiguous():
            need = (offset + t.numel()) * item  # the common case, without walking shape and strides
        else:
            need = (offset + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)) * item
    except Exception as exc:
        return f"has no accessible storage ({type(exc).__name__}: {str(exc)[:120]})"
    if need > nbytes:
        return (
            f"reaches byte {need} but its storage holds {nbytes} bytes: the storage was resized or freed after "
            f"the view was made"
        )
    return None
