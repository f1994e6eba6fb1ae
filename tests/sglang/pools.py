"""SGLang 0.5.23's own pool classes built on CPU: the one place this tier's tests get their pools from."""

from __future__ import annotations

from typing import Any

import torch

KW = {"device": "cpu", "enable_memory_saver": False}
MLA_ARGS = {"kv_lora_rank": 24, "qk_rope_head_dim": 8}
DSA_ARGS = dict(
    size=128,
    page_size=64,
    kv_lora_rank=24,
    dtype=torch.bfloat16,
    qk_rope_head_dim=8,
    layer_num=2,
    index_head_dim=128,
    kv_cache_dim=32,
    **KW,
)


def mp() -> Any:
    from sglang.srt.mem_cache import memory_pool

    return memory_pool


def fill(tensors: Any, start: int = 0) -> None:
    """Bytes that differ per tensor and per position, so a misplaced copy shows."""
    for i, t in enumerate(tensors):
        t.view(torch.uint8).copy_(
            (torch.arange(t.numel() * t.element_size()) % 241 + start + i)
            .to(torch.uint8)
            .view(t.view(torch.uint8).shape)
        )


def mha_pool(layers=3, start_layer=None, size=72, head_num=4, page_size=16, head_dim=8, v_head_dim=None) -> Any:
    pool = mp().MHATokenToKVPool(
        size=size,
        page_size=page_size,
        dtype=torch.bfloat16,
        head_num=head_num,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        layer_num=layers,
        start_layer=start_layer,
        **KW,
    )
    fill(pool.k_buffer), fill(pool.v_buffer, 100)
    return pool


def mla_pool(size: int = 72) -> Any:
    pool = mp().MLATokenToKVPool(size=size, page_size=16, dtype=torch.bfloat16, layer_num=2, **MLA_ARGS, **KW)
    fill(pool.kv_buffer)
    return pool


def swa(use_mla: bool = False) -> Any:
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    extra: dict[str, object] = {}
    if use_mla:
        child = {"page_size": 16, **KW, **MLA_ARGS}
        extra = dict(
            full_kv_pool_class=mp().MLATokenToKVPool,
            swa_kv_pool_class=mp().MLATokenToKVPool,
            full_kv_pool_kwargs=child,
            swa_kv_pool_kwargs=child,
        )
    return SWAKVPool(
        size=64,
        size_swa=32,
        page_size=16,
        dtype=torch.bfloat16,
        head_num=4,
        head_dim=8,
        swa_attention_layer_ids=[0, 2, 3],
        full_attention_layer_ids=[1, 4],
        **extra,
        **KW,
    )


def mamba(layers: list[int]) -> Any:
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=64, n_groups=2, num_heads=4, head_dim=8, state_size=16, conv_kernel=4
    )
    return mp().MambaPool(
        size=8,
        spec_state_size=0,
        cache_params=Mamba2CacheParams(shape=shape, layers=layers),
        mamba_layer_ids=layers,
        device="cpu",
    )


def hybrid_linear(use_mla=False, dsa=False, full=(1, 3), mamba_layers=(0, 2)) -> Any:
    """Linear attention + Mamba; ``dsa``: MLA children with a paged indexer cache."""
    extra: dict[str, object] = {"use_mla": True, **MLA_ARGS} if use_mla else {}
    if dsa:
        extra.update(use_dsa=True, index_head_dim=128, kv_cache_dim=32)
    return mp().HybridLinearKVPool(
        size=64,
        dtype=torch.bfloat16,
        page_size=64 if dsa else 16,
        head_num=4,
        head_dim=8,
        full_attention_layer_ids=list(full),
        device="cpu",
        mamba_pool=mamba(list(mamba_layers)),
        **extra,
    )


def minimax(size: int = 48, k_only: bool = False) -> Any:
    """``k_only``: layer 2's index keeps keys only (no value-sparse index)."""
    return mp().MiniMaxSparseKVPool(
        size=size,
        page_size=16,
        dtype=torch.bfloat16,
        head_num=4,
        head_dim=8,
        idx_head_dim=16,
        dense_layer_ids=[0],
        sparse_layer_ids=[1, 2],
        disable_value_sparse_layer_ids=[2] if k_only else None,
        start_layer=0,
        end_layer=3,
        **KW,
    )


def dsa(kpool: int = 1, skip: list[bool] | None = None, start_layer: int | None = None) -> Any:
    page = 64 * kpool
    layers = len(skip) if skip else 2
    return mp().DSATokenToKVPool(
        **{**DSA_ARGS, "size": 2 * page, "page_size": page, "layer_num": layers},
        index_kpool=kpool,
        skip_topk_layers=skip,
        start_layer=start_layer,
        end_layer=None if start_layer is None else start_layer + layers,
    )


def fp4() -> Any:
    return mp().MHATokenToKVPoolFP4(
        size=48, page_size=16, dtype=torch.float4_e2m1fn_x2, head_num=4, head_dim=32, layer_num=2, **KW
    )


def mxfp8(page_size: int = 16, layers: int = 2, heads: int = 2) -> Any:
    size = 256 if page_size == 128 else 48
    return mp().MHATokenToKVPoolMXFP8(
        size=size, page_size=page_size, dtype=torch.float8_e4m3fn, head_num=heads, head_dim=32, layer_num=layers, **KW
    )


def mla_fp4() -> Any:
    return mp().MLATokenToKVPoolFP4(
        size=48, page_size=16, dtype=torch.float4_e2m1fn_x2, kv_lora_rank=256, qk_rope_head_dim=64, layer_num=2, **KW
    )


def mamba_hybrid() -> Any:
    """The MHA linear-attention hybrid of the pool tests: attention at layers 2 and 5, Mamba at 0, 1 and 3."""
    return hybrid_linear(full=(2, 5), mamba_layers=(0, 1, 3))
