"""Plan FlexKV registration of a vLLM 0.33 ``register_kv_caches`` dict.

See :mod:`flexkv_adapter.readers.vllm_layout`. Every plan passes :func:`~flexkv_adapter.gate.admit` in
:func:`plan_form`: :func:`~flexkv_adapter.flexkv.plan` and the vLLM plugin (which plans through
:func:`plan_vllm`, at start-up and on every registration) both come here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..model.layout import ViewKind
from ..readers.vllm_layout import VLLMForm, vllm_form
from .checks import admit_plan, check_chunks
from .model import (
    LayoutFacts,
    ModelFacts,
    check_layout,
    check_model_dtype,
    model_facts,
    positive_int,
    registered_kv_heads,
)
from .plan_types import AddressingMode, FlexKVPlan, LayoutType, sealed


def plan_vllm(
    kv_caches: Mapping[str, torch.Tensor],
    *,
    kind: ViewKind | None = None,
    block_size: int | None = None,
    tp_size: int = 1,
    total_kv_heads: int | None = None,
    model_config: object = None,
    model_dtype: torch.dtype | None = None,
    content: int | None = None,
) -> FlexKVPlan:
    """The FlexKV plan of a vLLM 0.33 cache dict, checked block by block against the source views.

    ``block_size`` is vLLM's manager block (``cache_config.block_size``): kernel-block views are
    regrouped into it. ``num_kv_heads`` follows :func:`~flexkv_adapter.flexkv.model.registered_kv_heads`
    (1 for MLA; per-rank heads x ``tp_size`` for MHA, settled by ``total_kv_heads`` or
    ``model_config`` when there is one head per rank).
    """
    tp = positive_int(tp_size, "tp_size")
    total = positive_int(total_kv_heads, "total_kv_heads") if total_kv_heads is not None else None
    model = model_facts(model_config) if model_config is not None else None
    form = vllm_form(kv_caches, kind=kind, block_size=block_size, tp_size=tp, content=content)
    return plan_form(form, tp, total, model, model_dtype)


def plan_form(
    form: VLLMForm,
    tp_size: int = 1,
    total_kv_heads: int | None = None,
    model: ModelFacts | None = None,
    model_dtype: torch.dtype | None = None,
) -> FlexKVPlan:
    dtype = form.chunks[0].dtype
    name = f"vLLM KV cache ({'/'.join(form.geometry.layouts)})"
    check_model_dtype(model_dtype, dtype, name)
    facts = LayoutFacts(form.kind, form.num_layer, form.num_head, form.head_size, dtype, kv_dim=1)
    if model is not None:
        check_layout(facts, model, tp_size)
    result = FlexKVPlan(
        type=LayoutType(form.type),
        mode=AddressingMode(form.mode),
        num_layer=form.num_layer,
        num_block=form.num_block,
        tokens_per_block=form.tokens_per_block,
        num_head=form.num_head,
        head_size=form.head_size,
        kv_dim=1,
        num_kv_heads=registered_kv_heads(facts, tp_size, total=total_kv_heads, model=model),
        tensors=form.tensors,
        layer_ids=tuple(range(form.num_layer)),
        dtype=dtype,
        kind=form.kind,
    )
    # the gate (memory first, then FlexKV's arithmetic on it), as plan()'s as-is path. Only the main KV: a dict's
    # DeepSeek-V3.2 indexer entries (".k_cache") are never in a form (the vLLM plugin checks them: vllm_indexer)
    admit_plan(result, name)
    check_chunks(result, {0: list(form.chunks)}, name, tp_size)
    return sealed(result)
