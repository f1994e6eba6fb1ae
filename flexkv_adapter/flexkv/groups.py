"""FlexKV layer groups for a pool offloaded whole: one group per plane, all under the KV's block ids.

FlexKV's multi-group worker (``transfer/worker.py`` ``_init_multi_group``) copies each group with
its own chunk (``tokens_per_block // compress_ratio * num_kv_heads * head_size * dtype``) and GPU
block stride (from that group's ``KVCacheLayout``), but with ``kv_dim``, ``num_kv_heads`` and the
addressing mode of group 0 for every group: under an MHA KV (2L tensors, ``ptr[kv*L + l]``) every
group is a K list then a V list; under an MLA KV (L tensors) one tensor per layer. The server keeps
its ``ModelConfig.layer_groups`` over the registration's, and sizes CPU blocks from them, so the
config must carry exactly ``FlexKVPlan.flexkv_layer_groups()`` (:func:`check_model_groups`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..errors import NotAddressableError, PlanError
from ..gate import admit
from ..model.copy_rules import shard_problem
from ..model.hybrid import PartialPoolError, Plane, WholePool
from ..readers.planes import describe
from ._import import import_flexkv
from .checks import shared_kv_mode
from .plan_types import FlexKVPlan, GroupPlan

if TYPE_CHECKING:
    from ..model.views import PoolView

_MISSING = object()


def plan_groups(p: FlexKVPlan, view: PoolView, tp_size: int, source: str) -> tuple[GroupPlan, ...]:
    """Group 0 is the KV ``p`` plans; then one group per plane. The gate checks them as FlexKV will address
    them (:func:`~flexkv_adapter.gate.admit`, the same rules adapt() applied); only the tp rule is added here."""
    whole: WholePool = view.whole
    if p.mode.value == "TRTLLM" or p.tokens_per_block != view.page_size:
        raise PlanError(f"{source}: layer groups need per-layer KV tensors with page-sized blocks")
    admit(source, whole.groups(view), blocks=p.num_block, page=p.tokens_per_block)
    start = min(p.layer_ids)
    primary = GroupPlan(
        "KV",
        p.tensors,
        tuple(lid - start for lid in p.layer_ids),
        p.num_head,
        p.head_size,
        p.dtype,
        1,
        p.tokens_per_block,
        p.num_block,
        p.kv_dim,
    )
    return (primary, *(_plane_group(p, plane, start, tp_size, f"{source} {plane.name}") for plane in whole.planes))


def check_not_partial(view: PoolView) -> None:
    """A plain view of a pool with planes (``hybrid="error"`` keeps DSA's for FlexKV's connectors) loses them here."""
    if view.whole is not None or view.side_groups:  # whole, or attention-only by explicit choice
        return
    try:
        whole = describe(view.source, view, admit)
        missing = ", ".join(p.name for p in whole.planes) if whole is not None else ""
    except PartialPoolError as exc:
        missing = str(exc)
    if missing:
        raise PlanError(
            f"{view!r} holds the KV alone, but its pool keeps {missing} under the same page ids; registering it "
            f"would restore prefixes without them. Plan adapt(pool) without hybrid= to register the pool whole"
        )


def _plane_group(p: FlexKVPlan, plane: Plane, start: int, tp_size: int, where: str) -> GroupPlan:
    group = GroupPlan(
        plane.name,
        plane.tensors,
        tuple(lid - start for lid in plane.layer_ids),
        plane.num_heads,
        plane.head_size,
        plane.dtype,
        plane.compress_ratio,
        p.tokens_per_block // plane.compress_ratio,
        p.num_block,
        p.kv_dim,
    )
    if p.num_kv_heads == 1 and shared_kv_mode() == "sharded" and (problem := shard_problem(group.chunk_bytes, tp_size)):
        raise NotAddressableError(f"{where}: {problem}")
    return group


def registration(p: FlexKVPlan) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """``register_to_server``'s ``kv_caches`` and its layer-group keywords (none for one group)."""
    if not p.groups:
        return list(p.tensors), {}
    storage = import_flexkv("flexkv.common.storage")
    layouts = []
    for g in p.groups:
        fields = g.layout_fields()
        fields["type"] = storage.KVCacheLayoutType[fields["type"]]
        layouts.append(storage.KVCacheLayout(**fields))
    return [t for g in p.groups for t in g.tensors], {
        "layer_groups": p.flexkv_layer_groups(),
        "gpu_layouts": layouts,
        "handles_per_group": [list(g.tensors) for g in p.groups],
    }


_SPEC = ("num_layers", "num_kv_heads", "head_size", "layer_indices", "dtype", "compress_ratio")


def _spec_key(spec: object) -> tuple[Any, ...]:
    """A ``LayerGroupSpec`` (or a mapping of its fields) as comparable values."""
    values = [spec.get(n, _MISSING) if isinstance(spec, Mapping) else getattr(spec, n, _MISSING) for n in _SPEC]
    if isinstance(values[3], (list, tuple, range)):
        values[3] = tuple(values[3])
    return tuple(values)


def _show(keys: list[tuple[Any, ...]]) -> str:
    return "; ".join(str(dict(zip(_SPEC, k))) for k in keys) or "None"


def check_model_groups(p: FlexKVPlan, model_config: object) -> None:
    """FlexKV's server sizes and copies by ``model_config.layer_groups``: they must be this plan's, exactly."""
    wanted = [_spec_key(g.spec_fields()) for g in p.groups]
    if model_config is None:
        if wanted:
            raise PlanError(
                f"this pool registers {len(wanted)} FlexKV layer groups; pass model_config= (FlexKV's ModelConfig "
                f"carrying layer_groups=plan.flexkv_layer_groups()) so they can be checked before registering"
            )
        return
    raw = (
        model_config.get("layer_groups")
        if isinstance(model_config, Mapping)
        else getattr(model_config, "layer_groups", None)
    )
    have = [_spec_key(s) for s in raw] if raw else []
    if have == wanted:
        return
    raise PlanError(
        f"model_config.layer_groups = [{_show(have)}] but this pool registers [{_show(wanted)}]. FlexKV's server "
        f"keeps the model config's groups (it sizes CPU blocks and copies by them), so the registration would be "
        f"misread. Build the ModelConfig with layer_groups=plan.flexkv_layer_groups() and run FlexKV's "
        f"recompute_cache_block_counts before KVManager()"
    )
