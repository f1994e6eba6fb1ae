"""What FlexKV's CPU side believes about the model, and the head count the GPU layout must carry.

FlexKV sizes and splits its CPU/SSD blocks from ``ModelConfig`` (``num_kv_heads``, ``head_size``,
``dtype``, the per-stage layer count), never from the registered GPU layout, while its workers take
``num_kv_heads`` from the GPU layout as a switch: 1 = every rank holds the same KV, >1 = heads
are split across ranks (flexkv_consumers.md §1). The two must agree, or KV is corrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..config.integers import LIMIT, bounded_integer
from ..errors import AmbiguousLayoutError, PlanError
from ..model.views import PoolView
from ..text import short_repr

if TYPE_CHECKING:
    from .plan_types import FlexKVPlan

_MISSING = object()


@dataclass(frozen=True)
class ModelFacts:
    """The fields of a FlexKV ``ModelConfig`` that the GPU layout must agree with."""

    num_layers: int  # per pipeline stage
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    tp_size: int
    kv_dim: int | None  # None: the config does not say
    mla: bool | None  # use_mla (older FlexKV); None: the config does not say


@dataclass(frozen=True)
class LayoutFacts:
    """The same facts, read from the tensors of one rank."""

    kind: str  # "mha" | "mla"
    num_layers: int
    heads_per_rank: int
    head_size: int
    dtype: torch.dtype
    kv_dim: int  # 2: K and V planes (SGLang MHA); 1: one plane (MLA, or vLLM's packed [K | V] cells)


def _field(config: object, name: str) -> Any:
    """One guarded probe for a mapping key or an attribute: a property that raises is a PlanError."""
    try:
        if isinstance(config, Mapping):
            return config.get(name, _MISSING)
        return getattr(config, name, _MISSING)
    except Exception as exc:
        raise PlanError(
            f"model_config.{name} raised {type(exc).__name__} when read: {str(exc)[:200]}; pass FlexKV's "
            f"ModelConfig or a mapping of plain values"
        ) from None


def positive_int(value: object, name: str) -> int:
    """``value`` as a positive int (the one integer reader's rules); bools, floats and strings are refused."""
    return bounded_integer(value, name, 1, LIMIT, PlanError)


def model_facts(model_config: object) -> ModelFacts:
    """Read FlexKV's ``ModelConfig`` (or any object or mapping with the same fields)."""
    if isinstance(model_config, ModelFacts):
        return model_config
    values = {n: _field(model_config, n) for n in ("num_layers", "num_kv_heads", "head_size", "dtype", "tp_size")}
    missing = [n for n, v in values.items() if v is _MISSING]
    if missing:
        raise PlanError(
            f"model_config {short_repr(model_config)} lacks {missing}; pass FlexKV's ModelConfig or a mapping"
        )
    dtype = values["dtype"]
    if not isinstance(dtype, torch.dtype):
        raise PlanError(f"model_config dtype must be a torch.dtype, got {short_repr(dtype)}")
    layers = positive_int(values["num_layers"], "model_config.num_layers")
    per_stage = _field(model_config, "num_layers_per_pp_stage")
    pp_size = _field(model_config, "pp_size")
    if per_stage is not _MISSING:
        layers = positive_int(per_stage, "model_config.num_layers_per_pp_stage")
    elif pp_size is not _MISSING and pp_size != 1:
        raise PlanError(
            f"model_config has pp_size={short_repr(pp_size)}: FlexKV takes the layer count of this pipeline stage "
            f"(RankInfo.num_layers_per_pp_stage); pass a mapping that adds num_layers_per_pp_stage"
        )
    use_mla, kv_dim = _field(model_config, "use_mla"), _field(model_config, "kv_dim")
    if kv_dim is not _MISSING:  # the one integer reader: True, 1.0 or 2.0 are no kv_dim (`in (1, 2)` took them)
        kv_dim = bounded_integer(kv_dim, "model_config.kv_dim (1 or 2)", 1, 3, PlanError)
    if use_mla is not _MISSING and not isinstance(use_mla, bool):
        raise PlanError(f"model_config.use_mla must be a bool, got {short_repr(use_mla)}")
    return ModelFacts(
        num_layers=layers,
        num_kv_heads=positive_int(values["num_kv_heads"], "model_config.num_kv_heads"),
        head_size=positive_int(values["head_size"], "model_config.head_size"),
        dtype=dtype,
        tp_size=positive_int(values["tp_size"], "model_config.tp_size"),
        kv_dim=None if kv_dim is _MISSING else kv_dim,
        mla=use_mla if isinstance(use_mla, bool) else None,
    )


def registered_kv_heads(
    layout: LayoutFacts, tp_size: int, *, total: int | None = None, model: ModelFacts | None = None
) -> int:
    """FlexKV's GPU ``num_kv_heads``: 1 when every rank holds the same KV, else per-rank heads x tp.

    With ``model`` it must equal ``model.num_kv_heads`` (what the CPU side uses); without it,
    ``total`` (the model's KV heads) settles the one case the tensors cannot: one head per rank.
    """
    per_rank, split = layout.heads_per_rank, layout.heads_per_rank * tp_size
    if model is not None:
        if total is not None and total != model.num_kv_heads:
            raise PlanError(f"total_kv_heads={total} contradicts model_config.num_kv_heads={model.num_kv_heads}")
        total = model.num_kv_heads
    if layout.kind == "mla":
        wanted = 1
    elif per_rank == 1 and tp_size > 1 and total is None:
        raise AmbiguousLayoutError(
            f"one KV head per rank with tp_size={tp_size}: either the model has one KV head shared by every rank "
            f"(MQA: register 1) or {tp_size} heads split across ranks (register {tp_size}). Pass model_config= "
            f"(FlexKV's ModelConfig) or total_kv_heads=1 / total_kv_heads={tp_size}"
        )
    elif total is None or total == split:
        wanted = split
    elif total == 1 and per_rank == 1:
        wanted = 1  # MQA: every rank holds the model's only KV head
    elif total < tp_size:
        raise PlanError(
            f"replicated KV heads: the model has {total} KV head(s) for tp_size={tp_size}, so ranks hold copies. "
            f"FlexKV's CPU side has no correct head count for them unless ModelConfig.num_kv_heads counts the "
            f"replicas ({per_rank} per rank x {tp_size} = {split}, as FlexKV's vLLM config does; its SGLang "
            f"config counts the model total, which corrupts KV). Pass such a ModelConfig as model_config="
        )
    else:
        raise PlanError(
            f"{'model_config.num_kv_heads' if model else 'total_kv_heads'}={total} does not match {per_rank} "
            f"head(s) per rank x tp_size={tp_size} = {split}; "
            f"{'it is not divisible by tp_size' if total % tp_size else 'check tp_size'}"
        )
    if model is not None and wanted != model.num_kv_heads:
        raise PlanError(
            f"MLA KV is shared across ranks (num_kv_heads=1) but model_config.num_kv_heads="
            f"{model.num_kv_heads}; FlexKV's CPU side uses the latter. Set ModelConfig.num_kv_heads=1 for MLA"
        )
    return wanted


def check_model_dtype(model_dtype: torch.dtype | None, dtype: torch.dtype, source: str = "") -> None:
    """FlexKV sizes GPU blocks and strides with its model dtype: its element size must be the tensors'."""
    if model_dtype is not None and model_dtype.itemsize != dtype.itemsize:
        raise PlanError(
            f"{source}{': ' if source else ''}FlexKV's model dtype {model_dtype} has itemsize {model_dtype.itemsize} "
            f"but the KV data is {dtype} (itemsize {dtype.itemsize}); FlexKV sizes GPU blocks with the model dtype. "
            f"Set FLEXKV_KV_CACHE_DTYPE to a {dtype.itemsize}-byte dtype"
        )


def check_layout(layout: LayoutFacts, model: ModelFacts, tp_size: int) -> None:
    """Layer count, MLA-ness, head size and element size agree with the ModelConfig."""
    if tp_size != model.tp_size:
        raise PlanError(f"tp_size={tp_size} contradicts model_config.tp_size={model.tp_size}")
    if layout.num_layers != model.num_layers:
        raise PlanError(
            f"the source has {layout.num_layers} layers but model_config has {model.num_layers} per pipeline "
            f"stage; FlexKV's connectors take the layer count from the model config (an attention-only hybrid "
            f"view cannot be registered against the full model's layer count)"
        )
    if model.kv_dim is not None and model.kv_dim != layout.kv_dim:
        raise PlanError(
            f"the source ({layout.kind.upper()}) registers kv_dim={layout.kv_dim} but model_config.kv_dim="
            f"{model.kv_dim}; FlexKV would size its CPU blocks for the other layout"
        )
    if model.mla is not None and model.mla != (layout.kind == "mla"):
        raise PlanError(
            f"the source is {layout.kind.upper()} but model_config says use_mla={model.mla}; "
            f"FlexKV would size its CPU blocks for the other kind"
        )
    if layout.head_size != model.head_size:
        raise PlanError(f"head size {layout.head_size} != model_config.head_size={model.head_size}")
    check_model_dtype(model.dtype, layout.dtype)


def layout_facts(source: PoolView | FlexKVPlan) -> LayoutFacts:
    """The layout facts of an adapted view or a plan (one rank's tensors)."""
    if isinstance(source, PoolView):
        first = source.tensors()[0]  # [rows, heads, dim]
        kv_dim = 1 if source.kind == "mla" else 2
        return LayoutFacts(source.kind, len(source.layer_ids), first.shape[1], first.shape[2], first.dtype, kv_dim)
    return LayoutFacts(source.kind, source.num_layer, source.num_head, source.head_size, source.dtype, source.kv_dim)


def check_against_model_config(source: PoolView | FlexKVPlan, model_config: object, tp_size: int | None = None) -> int:
    """Refuse a view (or plan) FlexKV would misread under ``model_config``; return its ``num_kv_heads``.

    For engine hooks that hand a view to FlexKV's own connector, and for :func:`register` of a
    ready plan: checks the layer count (per pipeline stage), MLA-ness, head size, element size
    and the head-count rule of :func:`registered_kv_heads` (a plan must already carry that value).
    """
    model = model_facts(model_config)
    tp = model.tp_size if tp_size is None else positive_int(tp_size, "tp_size")
    layout = layout_facts(source)
    check_layout(layout, model, tp)
    heads = registered_kv_heads(layout, tp, model=model)
    if not isinstance(source, PoolView) and source.num_kv_heads != heads:
        raise PlanError(
            f"the plan registers num_kv_heads={source.num_kv_heads} but model_config needs {heads}; "
            f"re-plan with plan(..., model_config=)"
        )
    return heads


def check_for_flexkv_connector(view: PoolView, model_config: object, tp_size: int | None = None) -> None:
    """Refuse a view that FlexKV's own SGLang connector would register wrongly as its kvcache object.

    That connector registers ``num_kv_heads`` = the per-rank head count of the tensors
    (``integration/sglang/connector.py``), so one KV head per rank of a model whose heads are split
    across ranks reads as "shared" and corrupts KV; register such a pool with :func:`register`.
    """
    if view.whole is not None:  # that connector registers kv_buffer or k_buffer/v_buffer only
        raise PlanError(
            f"{view!r} is {view.whole.describe()}; FlexKV's SGLang connector would register the KV alone and "
            f"restore prefixes without the rest. Register it with flexkv_adapter.flexkv.register(view, client, "
            f"model_config=...) instead"
        )
    heads = check_against_model_config(view, model_config, tp_size)
    per_rank = layout_facts(view).heads_per_rank
    if per_rank == 1 and heads > 1:
        raise PlanError(
            f"{view!r} holds one KV head per rank of a model with {heads} (split across ranks). FlexKV's SGLang "
            f"connector registers num_kv_heads=1 for it, which FlexKV reads as KV shared by every rank and "
            f"corrupts. Register it with flexkv_adapter.flexkv.register(view, client, model_config=...) instead"
        )


__all__ = [
    "LayoutFacts",
    "ModelFacts",
    "check_against_model_config",
    "check_for_flexkv_connector",
    "check_layout",
    "model_facts",
    "positive_int",
    "registered_kv_heads",
    "layout_facts",
]
