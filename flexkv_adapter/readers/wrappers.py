"""Hybrid wrappers read: which sub-pool holds the attention layers, and what sits beside it.

Recognised by attributes, never class names:

* ``full_kv_pool`` + ``swa_kv_pool`` + ``layers_mapping``: sliding-window hybrids (SGLang's SWA pool);
* ``full_kv_pool`` + ``full_attention_layer_id_mapping`` and/or ``mamba_pool``: linear-attention
  hybrids (Qwen3-Next, Kimi-Linear, NemotronH, ...);
* ``main_pool`` (+ ``index_kv_pool`` / ``index_k_pool``): MiniMax sparse attention.

:func:`detect` reads a wrapper into one :class:`~flexkv_adapter.model.hybrid.HybridStructure`: the
attention sub-pool, its global layer ids, and every other state (SWA layers, Mamba state, index planes,
scale planes) as zero-copy :class:`~flexkv_adapter.model.hybrid.SideGroup` s. The layer metadata
(``layers_mapping``, id mappings, ``model_layer_ids``) is read here once, through the one integer rule
(:mod:`~flexkv_adapter.config.integers`): bools, floats, negatives and two keys that read as one id are
malformed metadata. What to do with the state FlexKV does not receive is the hybrid policy's
(:func:`~flexkv_adapter.pipeline.build.apply_policy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import torch

from ..config.integers import LIMIT, bounded_integer, read_flag, read_integer_list
from ..errors import AdapterError, InconsistentLayersError
from ..model.hybrid import DERIVED, LAYER_METADATA, HybridStructure, SideGroup
from ..text import short_repr
from .containers import probe

SCALE_PLANES = ("k_scale_buffer", "v_scale_buffer", "kv_scale_buffer")
# What FlexKV lacks for each refused row (docs/flexkv-upstream.md).
SWA_REASON = (
    "sliding-window KV in swa_kv_pool, its own page ids through full_to_swa_index_mapping; FlexKV's standard "
    "registration has no SWA channel (only DeepSeek-V4's) and snapshots one page per node, not a window"
)
MAMBA_REASON = "linear-attention state, one row per request slot; FlexKV has no slot-addressed state channel"


def bad_metadata(owner: object, attr: str, value: object, expected: str) -> InconsistentLayersError:
    return InconsistentLayersError(
        f"{type(owner).__name__}.{attr} = {short_repr(value)}: expected {expected}; the hybrid wrapper's "
        f"layer metadata is malformed, so which layers hold what cannot be trusted"
    )


def _id(value: object, where: str) -> int:
    return bounded_integer(value, where, 0, LIMIT, InconsistentLayersError)


def _distinct(owner: object, attr: str, mapping: object, ids: list[int]) -> None:
    if len(set(ids)) != len(ids):
        raise bad_metadata(owner, attr, mapping, "each layer id once (two keys read as the same integer)")


def _enumerates(indices: Iterable[int]) -> bool:
    """The sub-pool indices are 0..n-1, each once: otherwise a layer would be labelled with another's id."""
    ordered = sorted(indices)
    return ordered == list(range(len(ordered)))


def id_map(owner: object, attr: str) -> Mapping[object, object] | None:
    """The wrapper's id mapping ``attr``, None if absent. One that is present but no mapping (a list of
    pairs, a string) is malformed metadata, never skipped in favour of labels 0..n-1; so is one with two
    readings (SGLang looks layers up with ``[]``, this module reads ``items()``): see :func:`_one_reading`."""
    value = probe(owner, attr)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_metadata(owner, attr, value, "a dict of global layer id -> index in its sub-pool")
    _one_reading(owner, attr, value)
    return value


def _one_reading(owner: object, attr: str, mapping: Mapping[object, object]) -> None:
    """items(), iteration with ``[]``, and a second read of the attribute give the same objects in order."""
    try:
        items = list(mapping.items())
        looked_up = [(k, mapping[k]) for k in mapping]
        again = probe(owner, attr)
        again_items = list(again.items()) if isinstance(again, Mapping) else []
    except AdapterError:
        raise
    except Exception as exc:  # a raising __iter__/__getitem__/items
        raise bad_metadata(owner, attr, mapping, f"a mapping that reads without error ({type(exc).__name__})") from None
    for other in (looked_up, again_items):
        if len(other) != len(items) or any(a is not c or b is not d for (a, b), (c, d) in zip(items, other)):
            raise bad_metadata(
                owner,
                attr,
                mapping,
                "one reading: the same entries through items(), through iteration and [] (SGLang's lookup), and "
                "on every read of the attribute",
            )


def inverse(owner: object, attr: str, mapping: Mapping[object, object]) -> tuple[int, ...]:
    """Global layer ids in sub-pool order, from ``{global id: index in the sub-pool}``."""
    where = f"{type(owner).__name__}.{attr}"
    items = [(_id(i, f"{where}[{short_repr(g)}]"), _id(g, f"{where} key")) for g, i in mapping.items()]
    _distinct(owner, attr, mapping, [g for _, g in items])
    if not _enumerates(i for i, _ in items):
        expected = "a dict of global layer id -> index in the sub-pool (each index 0..n-1 once)"
        raise bad_metadata(owner, attr, mapping, expected)
    return tuple(g for _, g in sorted(items))


def swa_ids(pool: object, mapping: Mapping[object, object]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full-attention ids, SWA ids), each in sub-pool order, from ``{id: (index, is_swa)}``."""
    where = f"{type(pool).__name__}.layers_mapping"
    entries = []
    for g, value in mapping.items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise bad_metadata(pool, "layers_mapping", mapping, "a dict of layer id -> (index in its sub-pool, is_swa)")
        entry = f"{where}[{short_repr(g)}]"
        index, swa = _id(value[0], entry), read_flag(value[1], f"{entry} is_swa", InconsistentLayersError)
        entries.append((index, _id(g, f"{where} key"), swa))
    _distinct(pool, "layers_mapping", mapping, [g for _, g, _ in entries])
    entries.sort()
    for swa in (False, True):
        if not _enumerates(i for i, _, s in entries if s is swa):
            raise bad_metadata(pool, "layers_mapping", mapping, "each sub-pool's indices 0..n-1, once each")
    return tuple(g for _, g, swa in entries if not swa), tuple(g for _, g, swa in entries if swa)


def listed_ids(sub: object, attr: str = "model_layer_ids") -> tuple[int, ...]:
    """A sub-pool's own list of layer ids (``model_layer_ids``, ``mamba_layer_ids``); () if it has none."""
    ids = probe(sub, attr)
    if ids is None:
        return ()
    read = read_integer_list(ids, f"{type(sub).__name__}.{attr}", InconsistentLayersError)
    _distinct(sub, attr, ids, read)
    return tuple(read)


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
