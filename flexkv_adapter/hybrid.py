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
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from .errors import InconsistentLayersError, UnsupportedPoolError
from .planes import MAMBA_REASON, SWA_REASON, PartialPoolError, WholePool, describe
from .probe import probe
from .text import short_repr
from .views import PoolView

logger = logging.getLogger(__name__)

HybridMode = Literal["error", "attention_only"]
SCALE_PLANES = ("k_scale_buffer", "v_scale_buffer", "kv_scale_buffer")


class HybridPoolError(UnsupportedPoolError):
    """A hybrid pool, refused by default: FlexKV would receive only part of the model's state."""


@dataclass(frozen=True)
class SideGroup:
    """Pool memory besides the primary buffers, exposed zero-copy (FlexKV does not receive it)."""

    name: str
    tensors: tuple[torch.Tensor, ...]
    layer_ids: tuple[int, ...]
    index_space: str  # "token", "swa_token", "mamba_slot", "page"
    reason: str

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def describe(self) -> str:
        first = self.tensors[0] if self.tensors else None
        what = (
            f"{len(self.tensors)} x {tuple(first.shape)} {str(first.dtype).removeprefix('torch.')}"
            if first is not None
            else "no tensors found"
        )
        return f"{self.name}: {what}, layers {list(self.layer_ids)}, index space {self.index_space} ({self.reason})"


@dataclass(frozen=True)
class HybridStructure:
    family: str
    primary_attr: str
    primary: object
    layer_ids: tuple[int, ...] | None
    side_groups: tuple[SideGroup, ...]
    backing: tuple[tuple[int, str, object], ...]  # (global layer id, sub-pool attribute, sub-pool)


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


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _bad_metadata(owner: object, attr: str, value: object, expected: str) -> InconsistentLayersError:
    return InconsistentLayersError(
        f"{type(owner).__name__}.{attr} = {short_repr(value)}: expected {expected}; the hybrid wrapper's "
        f"layer metadata is malformed, so which layers hold what cannot be trusted"
    )


def _inverse(owner: object, attr: str, mapping: Mapping[object, object]) -> tuple[int, ...]:
    """Global layer ids in sub-pool order, from ``{global id: index in the sub-pool}``."""
    items = [(int(i), int(g)) for g, i in mapping.items() if _is_id(g) and _is_id(i)]  # type: ignore[call-overload]
    if len(items) != len(mapping) or not _enumerates(i for i, _ in items):
        expected = "a dict of global layer id -> index in the sub-pool (each index 0..n-1 once)"
        raise _bad_metadata(owner, attr, mapping, expected)
    return tuple(g for _, g in sorted(items))


def _enumerates(indices: Iterable[int]) -> bool:
    """The sub-pool indices are 0..n-1, each once: otherwise a layer would be labelled with another's id."""
    ordered = sorted(indices)
    return ordered == list(range(len(ordered)))


def _swa_ids(pool: object, mapping: Mapping[object, object]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full-attention ids, SWA ids), each in sub-pool order, from ``{id: (index, is_swa)}``."""
    entries = []
    for g, value in mapping.items():
        if not (
            _is_id(g)
            and isinstance(value, (tuple, list))
            and len(value) == 2
            and _is_id(value[0])
            and isinstance(value[1], bool)
        ):
            expected = "a dict of layer id -> (index in its sub-pool, is_swa)"
            raise _bad_metadata(pool, "layers_mapping", mapping, expected)
        entries.append((int(value[0]), int(g), bool(value[1])))  # type: ignore[call-overload]
    entries.sort()
    for swa in (False, True):
        if not _enumerates(i for i, _, s in entries if s is swa):
            raise _bad_metadata(pool, "layers_mapping", mapping, "each sub-pool's indices 0..n-1, once each")
    return tuple(g for _, g, swa in entries if not swa), tuple(g for _, g, swa in entries if swa)


def _ids(sub: object, attr: str = "model_layer_ids") -> tuple[int, ...]:
    ids = probe(sub, attr)
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple, range)) or not all(_is_id(i) for i in ids):
        raise _bad_metadata(sub, attr, ids, "a list of layer ids (integers)")
    return tuple(ids)


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


def _mamba_groups(mamba: object) -> list[SideGroup]:
    cache = probe(mamba, "mamba_cache")
    ids = _ids(mamba, "mamba_layer_ids")
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


def detect(pool: object) -> HybridStructure | None:
    """The hybrid structure of ``pool``, or None if it is not a recognised wrapper."""
    full, swa = probe(pool, "full_kv_pool"), probe(pool, "swa_kv_pool")
    mapping = probe(pool, "layers_mapping")
    if full is not None and swa is not None and isinstance(mapping, Mapping):
        full_ids, swa_ids = _swa_ids(pool, mapping)
        groups = [
            SideGroup(
                f"swa.{plane}",
                tuple(ts),
                swa_ids,
                "swa_token",
                SWA_REASON,
            )
            for plane, ts in _planes_of(swa).items()
        ]
        groups += scale_groups(swa, swa_ids, "swa.")
        backing = tuple((g, "full_kv_pool", full) for g in full_ids) + tuple((g, "swa_kv_pool", swa) for g in swa_ids)
        return HybridStructure("sglang-swa", "full_kv_pool", full, full_ids, tuple(groups), backing)
    id_map = probe(pool, "full_attention_layer_id_mapping")
    mamba = probe(pool, "mamba_pool")
    if full is not None and (isinstance(id_map, Mapping) or mamba is not None):
        full_ids = (
            _inverse(pool, "full_attention_layer_id_mapping", id_map) if isinstance(id_map, Mapping) else _ids(full)
        )
        groups = _mamba_groups(mamba) if mamba is not None else []
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
            sub_map = probe(pool, map_attr)
            ids = _inverse(pool, map_attr, sub_map) if isinstance(sub_map, Mapping) else _ids(sub)
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
        main_ids = _ids(main)
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


def resolve_mode(mode: str | None) -> HybridMode:
    if mode is None:
        from .settings import load_settings

        return load_settings().hybrid
    if mode not in ("error", "attention_only"):
        raise UnsupportedPoolError(f"hybrid must be 'error' or 'attention_only', got {short_repr(mode)}")
    return mode  # type: ignore[return-value]


def apply_policy(view: PoolView, pool: object, family: str, groups: Sequence[SideGroup], mode: str | None) -> PoolView:
    """Offload whole what FlexKV's layer groups can address; otherwise refuse (default) or go attention-only."""
    try:
        whole = describe(pool, view)
    except PartialPoolError as exc:
        if not groups and mode == "error":  # DSA as before: FlexKV's connectors read the indexer themselves
            return view
        if not groups or resolve_mode(mode) != "attention_only":
            raise HybridPoolError(str(exc)) from exc
        whole = None  # a refused row: attention_only keeps its meaning
    covered = {t.data_ptr() for p in whole.planes for t in p.tensors} if whole is not None else set()
    if whole is not None and all(g.tensors and {t.data_ptr() for t in g.tensors} <= covered for g in groups):
        return _offload_whole(view, pool, whole, bool(groups), mode)
    if not groups:
        return view
    excluded = tuple((lid, f"{g.name}: {g.reason}") for g in groups for lid in g.layer_ids)
    described = "; ".join(g.describe() for g in groups)
    left_out = sorted({lid for g in groups for lid in g.layer_ids})
    name = type(pool).__name__
    if resolve_mode(mode) != "attention_only":
        raise HybridPoolError(
            f"{name} is a hybrid pool ({family}): FlexKV would receive only the attention layers "
            f"{list(view.layer_ids)}. Not offloaded: {described}. Layers {left_out} would be restored without "
            f"that state, so a prefix hit would compute on missing or stale data. To offload the attention "
            f"layers anyway, pass adapt(pool, hybrid='attention_only') or set FLEXKV_ADAPTER_HYBRID=attention_only."
        )
    logger.warning(
        "%s (%s): offloading attention layers %s only; not offloaded: %s", name, family, list(view.layer_ids), described
    )
    report = replace(
        view.report,
        source_kind=name,
        recognizer=f"{family}/{view.report.recognizer}",
        excluded_layers=excluded,
        side_groups=tuple(g.describe() for g in groups),
        warnings=(*view.report.warnings, f"attention layers only: {len(groups)} side group(s) not offloaded"),
    )
    return view.rebuild(source=pool, side_groups=tuple(groups), report=report)


def _offload_whole(view: PoolView, pool: object, whole: WholePool, listed: bool, mode: str | None) -> PoolView:
    """The only exact choice for these pools; ``hybrid=`` may only refuse it, naming why."""
    name, what = type(pool).__name__, ", ".join(p.name for p in whole.planes)
    if mode == "attention_only":
        raise HybridPoolError(
            f"{name} can be offloaded whole: {what} share the KV's page ids and register as FlexKV layer groups "
            f"(plan(view).flexkv_layer_groups()). hybrid='attention_only' would register the KV alone, and a "
            f"prefix hit would restore it without them. Drop hybrid= (offloading whole is the default)"
        )
    if mode == "error" and listed:  # asked for the KV alone (a caller that registers only the KV buffers)
        raise HybridPoolError(
            f"{name} ({whole.family}) keeps {what} beside its KV; hybrid='error' asks for the KV alone, which "
            f"would restore prefixes without them. Drop hybrid= to offload it whole through FlexKV's layer groups"
        )
    if mode == "error":  # DSA: FlexKV's connectors read the indexer from the pool themselves
        return view
    logger.info("%s: %s", name, whole.describe())
    report = replace(view.report, source_kind=name, notes=(*view.report.notes, whole.describe()))
    return view.rebuild(source=pool, whole=whole, report=report)


__all__ = ["HybridPoolError", "HybridStructure", "SideGroup", "apply_policy", "check_kind", "detect"]
__all__ += ["scale_groups"]
