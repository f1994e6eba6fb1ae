"""Real SGLang 0.5.23 pools whose buffers are not indexed by the token ids the engine hands out, refused by name:
the unified-memory family (``--enable-unified-memory``: views indexed by physical, kernel-facing token ids,
while the allocator and radix cache hand out virtual ones) and MiniMax under HiSparse (the main pool holds a
hot subset). A one-layer ``UnifiedMLATokenToKVPool`` used to be adapted."""

from __future__ import annotations

import warnings

import pytest
import torch

from flexkv_adapter import UnsupportedPoolError, adapt
from flexkv_adapter.flexkv import plan

from .pools import KW, mp

PAGE = 16


def _unified(kind: str, layers: int) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.mem_cache import unified_memory_pool as u
    if kind == "mla":
        full = u.MLASubPoolSpec(
            name="full", layer_num=layers, grow_direction="up", kv_lora_rank=512, qk_rope_head_dim=64,
            store_dtype=torch.bfloat16,
        )  # fmt: skip
    else:
        full = u.MHASubPoolSpec(
            name="full", layer_num=layers, grow_direction="up", head_num=2, head_dim=64, store_dtype=torch.bfloat16
        )
    mamba = u.MambaSubPoolSpec(
        name="mamba", layer_num=1, grow_direction="down", conv_state_shapes=((4, 8),), conv_dtype=torch.bfloat16,
        temporal_state_shape=(2, 4, 4), temporal_dtype=torch.float32,
    )  # fmt: skip
    total = 32 * PAGE * full.entry_bytes() + 8 * mamba.entry_bytes()
    shared = u.UnifiedKVPool(
        total_bytes=total, sub_pool_specs=[full, mamba], device="cpu", enable_memory_saver=False, page_size=PAGE
    )
    if kind == "mla":
        return u.UnifiedMLATokenToKVPool(
            unified_buffer=shared, sub_pool_name="full", kv_cache_dtype=torch.bfloat16, page_size=PAGE
        )
    return u.UnifiedMHATokenToKVPool(unified_buffer=shared, sub_pool_name="full", page_size=PAGE)


@pytest.mark.parametrize("kind, layers", [("mla", 1), ("mla", 2), ("mha", 1)])
def test_unified_memory_pools_are_refused_naming_why(kind, layers):
    pool = _unified(kind, layers)
    for call in (adapt, plan):
        with pytest.raises(UnsupportedPoolError, match="unified-memory pool.*virtual"):
            call(pool)


def test_minimax_under_hisparse_is_refused_naming_hisparse():
    try:
        pool = mp().MiniMaxSparseKVPool(
            size=48, page_size=PAGE, dtype=torch.bfloat16, head_num=4, head_dim=8, idx_head_dim=16,
            dense_layer_ids=[0], sparse_layer_ids=[1, 2], start_layer=0, end_layer=3, enable_hisparse=True, **KW,
        )  # fmt: skip
    except TypeError as exc:  # constructor arguments differ between releases
        pytest.skip(f"MiniMaxSparseKVPool signature: {exc}")
    for call in (adapt, plan):
        with pytest.raises(UnsupportedPoolError, match=r"main_pool \(HiSparseMHAMainPool\) is a HiSparse pool"):
            call(pool)
