"""SGLang-style MHA and MLA pools: zero-copy views that alias every layer, proven through getters."""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import MHAView, MLAView, adapt

from ..helpers import SGLangLikeMHAPool, SGLangLikeMLAPool, assert_aliases, flexkv_block_bytes, region_bytes


@pytest.mark.parametrize(
    ("dtype", "v_head_dim", "start_layer"),
    [(torch.float32, None, 0), (torch.float32, 6, 0), (torch.float8_e4m3fn, None, 0), (torch.float32, 6, 7)],
    ids=["mha", "v_head_dim!=head_dim", "fp8-as-uint8", "pp-stage-start-7"],
)
def test_mha_views_alias_every_layer_through_the_pool_getters(dtype, v_head_dim, start_layer):
    pool = SGLangLikeMHAPool(
        size=54,
        page_size=16,
        dtype=dtype,
        head_num=4,
        head_dim=8,
        layer_num=3,
        start_layer=start_layer,
        v_head_dim=v_head_dim,
    )
    view = adapt(pool)
    assert isinstance(view, MHAView)
    assert view.layer_ids == [start_layer, start_layer + 1, start_layer + 2]
    assert view.num_blocks == 4 and view.page_size == 16  # 70 rows -> 64
    for i, layer_id in enumerate(view.layer_ids):
        k, v = view.k_buffer[i], view.v_buffer[i]
        assert k.shape == (64, 4, 8) and v.shape == (64, 4, v_head_dim or 8)
        assert k.dtype == pool.store_dtype
        assert_aliases(k, pool.k_buffer[i][:64], pool.k_buffer[i])
        assert_aliases(v, pool.v_buffer[i][:64], pool.v_buffer[i])
        # The pool's own getters see writes made through the view.
        k.view(torch.uint8)[5].fill_(77)
        assert torch.equal(pool.get_key_buffer(layer_id)[5].view(torch.uint8), k[5].view(torch.uint8))
        v.view(torch.uint8)[63].fill_(78)
        assert (pool.get_value_buffer(layer_id)[63].view(torch.uint8) == 78).all()


def test_mla_view_aliases_kv_buffer_and_the_value_getter():
    pool = SGLangLikeMLAPool(
        size=54, page_size=16, dtype=torch.float32, kv_lora_rank=24, qk_rope_head_dim=8, layer_num=3
    )
    view = adapt(pool)
    assert isinstance(view, MLAView)
    assert view.report.kind == "mla" and view.layer_ids == [0, 1, 2]
    for i in range(3):
        kv = view.kv_buffer[i]
        assert kv.shape == (64, 1, 32)
        assert_aliases(kv, pool.kv_buffer[i][:64], pool.kv_buffer[i])
        kv[3, 0, :24] = -11.0
        assert (pool.get_value_buffer(i)[3] == -11.0).all()
        assert torch.equal(pool.get_key_buffer(i)[3], kv[3])


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_flexkv_block_arithmetic_reads_the_pools_blocks(kind):
    """FlexKV reads block b at data_ptr + b*block_bytes; those bytes are the pool's page b."""
    if kind == "mha":
        pool = SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=4, layer_num=2)
        sources = pool.k_buffer + pool.v_buffer
    else:
        pool = SGLangLikeMLAPool(
            size=48, page_size=16, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
        )
        sources = pool.kv_buffer
    view = adapt(pool)
    tensors = view.tensors()
    assert len(tensors) == len(sources)
    for t, src in zip(tensors, sources):
        for b in range(view.num_blocks):
            assert flexkv_block_bytes(t, b, 16) == region_bytes(src[b * 16 : (b + 1) * 16])


def test_views_are_contiguous_and_own_no_memory():
    pool = SGLangLikeMHAPool(size=54, page_size=16, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=3)
    view = adapt(pool)
    for t, src in zip(view.tensors(), pool.k_buffer + pool.v_buffer):
        assert t.is_contiguous()
        assert t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    assert view.report.bytes_copied == 0
    assert view.report.bytes_aliased == sum(t.numel() * t.element_size() for t in view.tensors())
