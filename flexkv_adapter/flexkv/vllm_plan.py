"""Plan FlexKV registration of a vLLM 0.33 ``register_kv_caches`` dict (see :mod:`~flexkv_adapter.vllm_layout`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import PlanError
from ..layout import ViewKind
from ..vllm_layout import VLLMForm, vllm_form
from .plan import AddressingMode, FlexKVPlan, LayoutType, _check_chunks, _num_kv_heads


def plan_vllm(
    kv_caches: Mapping[str, torch.Tensor],
    *,
    kind: ViewKind | None = None,
    block_size: int | None = None,
    tp_size: int = 1,
    total_kv_heads: int | None = None,
    replicated_kv_heads: bool = False,
    model_dtype: torch.dtype | None = None,
    content: int | None = None,
) -> FlexKVPlan:
    """The FlexKV plan of a vLLM 0.33 cache dict, checked block by block against the source views.

    ``block_size`` is vLLM's manager block (``cache_config.block_size``): kernel-block views are
    regrouped into it. ``num_kv_heads`` is 1 for MLA and heads per rank x ``tp_size`` for MHA.
    """
    form = vllm_form(kv_caches, kind=kind, block_size=block_size, tp_size=tp_size, content=content)
    return plan_form(form, tp_size, total_kv_heads, replicated_kv_heads, model_dtype)


def plan_form(
    form: VLLMForm,
    tp_size: int = 1,
    total_kv_heads: int | None = None,
    replicated_kv_heads: bool = False,
    model_dtype: torch.dtype | None = None,
) -> FlexKVPlan:
    dtype = form.chunks[0].dtype
    name = f"vLLM KV cache ({'/'.join(form.geometry.layouts)})"
    if model_dtype is not None and model_dtype.itemsize != dtype.itemsize:
        raise PlanError(
            f"{name}: FlexKV's model dtype {model_dtype} has itemsize {model_dtype.itemsize} but the KV cache "
            f"holds {dtype}; set FLEXKV_KV_CACHE_DTYPE to a {dtype.itemsize}-byte dtype"
        )
    result = FlexKVPlan(
        type=LayoutType(form.type),
        mode=AddressingMode(form.mode),
        num_layer=form.num_layer,
        num_block=form.num_block,
        tokens_per_block=form.tokens_per_block,
        num_head=form.num_head,
        head_size=form.head_size,
        kv_dim=1,
        num_kv_heads=_num_kv_heads(form.kind, form.num_head, tp_size, total_kv_heads, replicated_kv_heads),
        tensors=form.tensors,
        layer_ids=tuple(range(form.num_layer)),
        dtype=dtype,
    )
    _check_chunks(result, {0: list(form.chunks)}, name)
    return result
