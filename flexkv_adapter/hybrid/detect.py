"""Hybrid pools: wrappers whose attention layers sit beside other state FlexKV does not receive.

Recognised by attributes, never class names:

* ``full_kv_pool`` + ``swa_kv_pool`` + ``layers_mapping``: sliding-window hybrids (SGLang's SWA pool);
* ``full_kv_pool`` + ``full_attention_layer_id_mapping`` and/or ``mamba_pool``: linear-attention
  hybrids (Qwen3-Next, Kimi-Linear, NemotronH, ...);
* ``main_pool`` (+ ``index_kv_pool`` / ``index_k_pool``): MiniMax sparse attention.

The view's primary buffers are the attention sub-pool's; everything else (SWA layers, Mamba
state, index planes, and the scale planes of quantised pools) is exposed zero-copy as
:class:`SideGroup` s. Offloading only the attention layers cannot restore a prefix for a model
that also needs that state, so by default :func:`apply_policy` refuses, naming what would be left
out; ``hybrid="attention_only"`` (or ``FLEXKV_ADAPTER_HYBRID=attention_only``) opts in.

This module detects; the layer metadata is read in :mod:`.hybrid_ids`, the policy lives in
:mod:`.hybrid_policy`, the records in :mod:`.hybrid_types` (all re-exported here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..errors import InconsistentLayersError
from ..readers.probe import probe
from .ids import id_map, inverse, listed_ids, swa_ids
from .planes import DERIVED, LAYER_METADATA, MAMBA_REASON, SCALE_PLANES, SWA_REASON
from .policy import apply_policy, resolve_mode
from .types import HybridMode, HybridPoolError, HybridStructure, SideGroup


def _tensor_list(value: object) -> list[torch.Tensor] | None:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
        return list(value)
    return None


def pool_kind(sub: object) -> str | None:
    """ "mla" if it carries ``kv_buffer``, "mha" if ``k_buffer`` and ``v_buffer``, else None."""
    if _tensor_list(probe(sub, "kv_buffer")):
        return "mla"
    if _tensor_list(probe(sub, "k_buffer")) and _tensor_list(probe(sub, "v_buffer")):
        return "mha"
    return None


def _planes_of(sub: object) -> dict[str, list[torch.Tensor]]:
    names = ("kv_buffer",) if pool_kind(sub) == "mla" else ("k_buffer", "v_buffer")
    return {n.removesuffix("_buffer"): ts for n in names if (ts := _tensor_list(probe(sub, n)))}


def scale_groups(pool: object, layer_ids: Sequence[int], prefix: str = "") -> list[SideGroup]:
    """Scale planes of quantised pools (FP4/MXFP8): without them the bytes cannot be dequantised."""
    return [
        SideGroup(
            f"{prefix}{name}",
            tuple(ts),
            tuple(layer_ids),
            "token",
            "quantisation scales; FlexKV's connector registers only the KV data",
        )
        for name in SCALE_PLANES
        if (ts := _tensor_list(probe(pool, name)))
    ]


INDEX_REASON = (
    "the DSA indexer's keys, which the attention layers read to select KV; registering the wrapper's attention "
    "sub-pool leaves them out"
)


def plane_groups(sub: object, layer_ids: Sequence[int], prefix: str) -> list[SideGroup]:
    """A wrapper's sub-pool's own planes beside its KV (scales, a DSA indexer): the wrapper does not expose
    them, so only the sub-pool shows they exist; listed, never left out unnamed."""
    groups = scale_groups(sub, layer_ids, prefix)
    index = _tensor_list(probe(sub, "index_k_with_scale_buffer"))
    if index:
        kept = [(lid, t) for lid, t in zip(layer_ids, index) if t.numel()] if len(index) == len(layer_ids) else []
        tensors, ids = (tuple(t for _, t in kept), tuple(i for i, _ in kept)) if kept else (tuple(index), ())
        groups.append(SideGroup(f"{prefix}index_k_with_scale_buffer", tensors, ids, "page", INDEX_REASON))
    return groups


def _mamba_groups(mamba: object) -> list[SideGroup]:
    cache = probe(mamba, "mamba_cache")
    ids = listed_ids(mamba, "mamba_layer_ids")
    unknown = [
        SideGroup(
            "mamba",
            (),
            ids,
            "mamba_slot",
            f"{type(mamba).__name__} holds linear-attention state this adapter cannot enumerate",
        )
    ]
    fields = (
        [f.name for f in dataclasses.fields(cache)]
        if dataclasses.is_dataclass(cache)
        else list(probe(cache, "__dict__") or ())  # objects without __dict__ (slots, ints): not enumerable
    )
    groups = []
    for field in fields:
        value = probe(cache, field)
        tensors = _tensor_list(value)
        if not tensors:
            continue
        named = [(f"mamba.{field}[{i}]", t) for i, t in enumerate(tensors)]
        for name, t in named if isinstance(value, (list, tuple)) else [(f"mamba.{field}", tensors[0])]:
            groups.append(SideGroup(name, (t,), ids, "mamba_slot", MAMBA_REASON))
    return groups or unknown


_SUB_POOLS = frozenset({"full_kv_pool", "swa_kv_pool", "mamba_pool", "main_pool", "index_kv_pool", "index_k_pool"})
UNLISTED_REASON = "state the wrapper holds itself, which this adapter does not enumerate; FlexKV does not receive it"


def wrapper_state(pool: object) -> list[SideGroup]:
    """Tensors the wrapper holds itself (QSA's compressed index and per-request ring, say): listed, never
    silently left out of what attention-only drops. A second view of already-listed memory is not repeated."""
    groups: list[SideGroup] = []
    seen: set[int] = set()
    for attr, value in (vars(pool) if hasattr(pool, "__dict__") else {}).items():
        tensors = _tensor_list(value)
        if attr in _SUB_POOLS | DERIVED | LAYER_METADATA or not tensors or not any(t.numel() for t in tensors):
            continue
        storages = {t.untyped_storage().data_ptr() for t in tensors}
        if not storages <= seen:
            groups.append(SideGroup(attr, tuple(tensors), (), "unknown", UNLISTED_REASON))
        seen |= storages
    return groups


def detect(pool: object) -> HybridStructure | None:
    """The hybrid structure of ``pool``, or None if it is not a recognised wrapper."""
    full, swa = probe(pool, "full_kv_pool"), probe(pool, "swa_kv_pool")
    mapping = id_map(pool, "layers_mapping") if full is not None and swa is not None else None
    if full is not None and swa is not None and mapping is not None:
        full_ids, window_ids = swa_ids(pool, mapping)
        groups = [
            SideGroup(
                f"swa.{plane}",
                tuple(ts),
                window_ids,
                "swa_token",
                SWA_REASON,
            )
            for plane, ts in _planes_of(swa).items()
        ]
        groups += plane_groups(swa, window_ids, "swa.") + wrapper_state(pool)
        backing = tuple((g, "full_kv_pool", full) for g in full_ids) + tuple(
            (g, "swa_kv_pool", swa) for g in window_ids
        )
        return HybridStructure("sglang-swa", "full_kv_pool", full, full_ids, tuple(groups), backing)
    full_map = id_map(pool, "full_attention_layer_id_mapping") if full is not None else None
    mamba = probe(pool, "mamba_pool")
    if full is not None and (full_map is not None or mamba is not None):
        full_ids = (
            inverse(pool, "full_attention_layer_id_mapping", full_map) if full_map is not None else listed_ids(full)
        )
        groups = (_mamba_groups(mamba) if mamba is not None else []) + wrapper_state(pool)
        backing = tuple((g, "full_kv_pool", full) for g in full_ids)
        return HybridStructure("hybrid-linear", "full_kv_pool", full, full_ids or None, tuple(groups), backing)
    main = probe(pool, "main_pool")
    if main is not None:
        groups = []
        for attr, map_attr in (
            ("index_kv_pool", "index_kv_layer_id_mapping"),
            ("index_k_pool", "index_k_layer_id_mapping"),
        ):
            sub = probe(pool, attr)
            if sub is None:
                continue
            sub_map = id_map(pool, map_attr)
            ids = inverse(pool, map_attr, sub_map) if sub_map is not None else listed_ids(sub)
            planes = {
                n.removesuffix("_buffer"): ts for n in ("k_buffer", "v_buffer") if (ts := _tensor_list(probe(sub, n)))
            }
            groups += [
                SideGroup(
                    f"{attr.removesuffix('_pool')}.{plane}",
                    tuple(ts),
                    ids,
                    "token",
                    "sparse-attention index plane used to select KV at decode",
                )
                for plane, ts in planes.items()
            ]
        main_ids = listed_ids(main)
        backing = tuple((g, "main_pool", main) for g in main_ids)
        return HybridStructure("minimax-sparse", "main_pool", main, main_ids or None, tuple(groups), backing)
    return None


def check_kind(pool: object, structure: HybridStructure, requested: str | None) -> None:
    """A requested kind every attention layer's backing pool must have (the seed's TypeError)."""
    if requested is None:
        return
    for layer, attr, sub in structure.backing:
        kind = pool_kind(sub)
        if kind is not None and kind != requested:
            shape = "kv_buffer" if kind == "mla" else "k_buffer/v_buffer"
            raise InconsistentLayersError(
                f"Layer {layer} is not backed by an {requested.upper()} KV pool: {type(pool).__name__}.{attr} is "
                f"{type(sub).__name__} ({kind.upper()}, {shape}) but kind={requested!r} was requested. Fix: drop "
                f"kind= to follow the sub-pool, or build the pool with {requested.upper()} sub-pools "
                f"(e.g. full_kv_pool_class/swa_kv_pool_class) if the model really is {requested.upper()}."
            )


__all__ = ["HybridMode", "HybridPoolError", "HybridStructure", "SideGroup", "apply_policy", "check_kind", "detect"]
__all__ += ["plane_groups", "pool_kind", "resolve_mode", "scale_groups", "wrapper_state"]
