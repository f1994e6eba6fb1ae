"""Options of :func:`~flexkv_adapter.adapt` and how they combine with the pool's own metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypedDict

import torch

from .axes import AxesLike, parse_axes
from .errors import AdapterError, InconsistentLayersError, NotAddressableError
from .layout import Geometry, ViewKind


class AdaptOptions(TypedDict, total=False):
    """Keyword options of :func:`~flexkv_adapter.adapt`; each settles one fact about the pool.

    kind: "mha" or "mla", when the tensors alone cannot tell.
    axes: the meaning of each tensor axis, e.g. "L KV N H D" (see :class:`~flexkv_adapter.Axis`).
    attrs: the attribute name(s) to read: one (K and V together, or MLA) or two (K, V).
    layer_num, head_num, head_dim, v_head_dim, kv_dim: geometry the tensors must match.
    start_layer: global id of the first layer (pipeline stages); layer_ids: explicit ids.
    dtype: expose the bytes as this dtype (zero-copy); for a 1-D byte buffer, its element type.
    shape, offset: the declared geometry of a 1-D byte buffer (offset in bytes).
    spec: a :class:`~flexkv_adapter.spec.LayoutSpec`, a dict, or a YAML path describing the layout.
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


def _pool_int(pool: object, name: str) -> int | None:
    value = getattr(pool, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pool_kv_dim(pool: object) -> tuple[int | None, str]:
    if (dim := _pool_int(pool, "kv_cache_dim")) is not None:
        return dim, "pool.kv_cache_dim"
    rank, rope = _pool_int(pool, "kv_lora_rank"), _pool_int(pool, "qk_rope_head_dim")
    if rank is not None and rope is not None:
        return rank + rope, "pool.kv_lora_rank + pool.qk_rope_head_dim"
    return None, ""


def resolve_geometry(pool: object, page_size: int | None, options: AdaptOptions) -> Geometry:
    """Merge options with the pool's metadata; an option that contradicts the pool is an error."""
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise AdapterError(f"unknown adapt() option(s) {sorted(unknown)}; known: {sorted(KNOWN_OPTIONS)}")
    given: dict[str, object] = {k: v for k, v in options.items() if v is not None}
    if page_size is not None:
        given["page_size"] = page_size
    facts: dict[str, object] = {}
    sources: list[tuple[str, str]] = []
    pool_facts: dict[str, tuple[int | None, str]] = {n: (_pool_int(pool, n), f"pool.{n}") for n in _POOL_INTS}
    pool_facts["kv_dim"] = _pool_kv_dim(pool)
    logical = getattr(pool, "dtype", None)
    if isinstance(logical, torch.dtype) and str(logical).endswith("_x2"):
        # Packed dtypes (FP4 as float4_e2m1fn_x2) store two values per element: the buffers'
        # last dim is half the pool's head dims.
        for name in ("head_dim", "v_head_dim", "kv_dim"):
            value, origin = pool_facts[name]
            if value is not None:
                pool_facts[name] = (value // 2, f"{origin} / 2 ({logical} packs two values per element)")
    for name, (value, origin) in pool_facts.items():
        if value is None:
            continue
        if name in given and given[name] != value:
            raise InconsistentLayersError(
                f"{type(pool).__name__}: option {name}={given[name]!r} contradicts {origin}={value}; "
                f"drop the option or fix the pool metadata"
            )
        facts[name] = value
        sources.append((name, origin))
    facts.update(given)
    for name in ("layer_num", "head_num", "head_dim", "v_head_dim", "kv_dim", "page_size"):
        fact = facts.get(name)
        if fact is not None and (not isinstance(fact, int) or isinstance(fact, bool) or fact <= 0):
            raise AdapterError(f"{name} must be a positive integer, got {fact!r}")
    kind = facts.get("kind")
    if kind not in (None, "mha", "mla"):
        raise AdapterError(f"kind must be 'mha' or 'mla', got {kind!r}")
    try:
        axes = parse_axes(options["axes"]) if options.get("axes") is not None else None
    except ValueError as exc:
        raise AdapterError(f"invalid axes option: {exc}") from None
    layout = getattr(pool, "kv_cache_layout", None)  # SGLang MHA pools: "nhd" | "hnd" | "vectorized_5d"
    if axes is None and layout == "hnd":
        axes, kind = parse_axes("P H T D"), kind or "mha"
    elif axes is None and layout == "vectorized_5d":
        raise NotAddressableError(
            f"{type(pool).__name__}: kv_cache_layout='vectorized_5d' (ROCm AITER) packs K as "
            f"[blocks, heads, dim/X, page, X]; no per-layer [rows, heads, dim] view exists. Fix: run the engine "
            f"with the NHD layout (unset SGLANG_AITER_KV_CACHE_LAYOUT)"
        )
    attrs = tuple(options["attrs"]) if options.get("attrs") else None
    if attrs is not None and len(attrs) not in (1, 2):
        raise AdapterError(f"attrs takes one or two attribute names, got {attrs!r}")
    layer_ids = tuple(int(i) for i in options["layer_ids"]) if options.get("layer_ids") is not None else None
    dtype = options.get("dtype")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise AdapterError(f"dtype must be a torch.dtype, got {dtype!r}")
    return Geometry(
        layer_num=facts.get("layer_num"),  # type: ignore[arg-type]
        head_num=facts.get("head_num"),  # type: ignore[arg-type]
        head_dim=facts.get("head_dim"),  # type: ignore[arg-type]
        v_head_dim=facts.get("v_head_dim"),  # type: ignore[arg-type]
        kv_dim=facts.get("kv_dim"),  # type: ignore[arg-type]
        page_size=facts.get("page_size"),  # type: ignore[arg-type]
        start_layer=int(facts.get("start_layer", 0)),  # type: ignore[call-overload]
        kind=kind,  # type: ignore[arg-type]
        axes=axes,
        attrs=attrs,
        layer_ids=layer_ids,
        dtype=dtype,
        sources=tuple(sources),
        given=frozenset(given),
    )
