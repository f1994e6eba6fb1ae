"""Conformance against SGLang's own pool classes (sglang 0.5.23, CPU): adapt, alias, refuse."""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import InconsistentLayersError, MHAView, MLAView, NotAddressableError, UnsupportedPoolError, adapt
from flexkv_adapter.flexkv import plan
from flexkv_adapter.model.hybrid import HybridPoolError

from ..helpers import flexkv_worker_read, region_bytes
from .pools import DSA_ARGS, KW, fill, mamba_hybrid, minimax, mp, swa


def _assert_write_through(view_t: torch.Tensor, getter_t: torch.Tensor) -> None:
    """Bytes written through the view are what the pool's getter returns, and back."""
    rows = view_t.shape[0]
    raw_view = view_t.view(torch.uint8).view(rows, -1)
    raw_pool = getter_t[:rows].view(torch.uint8).view(rows, -1)  # .view: fails rather than copies
    raw_view[rows // 2].fill_(251)
    assert torch.equal(raw_pool[rows // 2], raw_view[rows // 2])
    raw_pool[rows - 1].fill_(252)
    assert (raw_view[rows - 1] == 252).all()
    assert view_t.untyped_storage().data_ptr() == getter_t.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("dtype", "v_head_dim", "start_layer"),
    [
        (torch.bfloat16, None, None),
        (torch.float8_e4m3fn, None, None),
        (torch.bfloat16, 16, None),
        (torch.bfloat16, None, 5),
    ],
    ids=["bf16", "fp8-as-uint8", "v_head_dim!=head_dim", "pp-start-5"],
)
def test_mha_token_to_kv_pool(dtype, v_head_dim, start_layer):
    pool = mp().MHATokenToKVPool(
        size=64,
        page_size=16,
        dtype=dtype,
        head_num=4,
        head_dim=8,
        layer_num=3,
        v_head_dim=v_head_dim,
        start_layer=start_layer,
        **KW,
    )
    fill(pool.k_buffer), fill(pool.v_buffer, 100)
    view = adapt(pool)
    assert isinstance(view, MHAView) and view.num_blocks == 5
    first = start_layer or 0
    assert view.layer_ids == [first, first + 1, first + 2]
    for i, layer_id in enumerate(view.layer_ids):
        assert torch.equal(view.k_buffer[i].view(torch.uint8), pool.get_key_buffer(layer_id).view(torch.uint8))
        _assert_write_through(view.k_buffer[i], pool.get_key_buffer(layer_id))
        _assert_write_through(view.v_buffer[i], pool.get_value_buffer(layer_id))
    if v_head_dim is None:
        p = plan(view)
        for layer in range(3):
            for kv, plane in enumerate((pool.k_buffer, pool.v_buffer)):
                for block in range(5):
                    expected = region_bytes(plane[layer][block * 16 : (block + 1) * 16])
                    assert flexkv_worker_read(p.layout_fields(), list(p.tensors), layer, kv, block) == expected


def test_mla_token_to_kv_pool():
    pool = mp().MLATokenToKVPool(
        size=64, page_size=16, dtype=torch.bfloat16, kv_lora_rank=24, qk_rope_head_dim=8, layer_num=2, **KW
    )
    fill(pool.kv_buffer)
    view = adapt(pool)
    assert isinstance(view, MLAView) and view.kv_buffer[0].shape == (80, 1, 32)
    for i in range(2):
        _assert_write_through(view.kv_buffer[i], pool.get_key_buffer(i))
        view.kv_buffer[i][7, 0, :24].view(torch.uint8).fill_(9)
        assert (pool.get_value_buffer(i)[7].view(torch.uint8) == 9).all()
    assert plan(view).num_kv_heads == 1


def test_dsa_token_to_kv_pool_passes_the_indexer_through():
    pool = mp().DSATokenToKVPool(**DSA_ARGS)
    view = adapt(pool)
    assert isinstance(view, MLAView) and view.num_blocks == 3
    indexer = pool.index_k_with_scale_buffer
    assert [t.data_ptr() for t in view.index_k_with_scale_buffer] == [t.data_ptr() for t in indexer]
    _assert_write_through(view.kv_buffer[1], pool.get_key_buffer(1))


def test_swa_pool_is_refused_by_default_naming_the_left_out_layers():
    with pytest.raises(HybridPoolError) as err:
        adapt(swa())
    msg = str(err.value)
    assert "attention layers [1, 4]" in msg and "swa.k" in msg and "layers [0, 2, 3]" in msg
    assert "hybrid='attention_only'" in msg and "FLEXKV_ADAPTER_HYBRID" in msg


def test_swa_pool_attention_only_exposes_full_layers_and_swa_side_groups(caplog):
    pool = swa()
    view = adapt(pool, hybrid="attention_only")
    assert isinstance(view, MHAView) and view.layer_ids == [1, 4] and view.source is pool
    assert sorted({lid for lid, _ in view.report.excluded_layers}) == [0, 2, 3]
    assert any("attention layers [1, 4] only" in m for m in caplog.messages)
    for i, layer_id in enumerate(view.layer_ids):
        _assert_write_through(view.k_buffer[i], pool.get_key_buffer(layer_id))
        _assert_write_through(view.v_buffer[i], pool.get_value_buffer(layer_id))
    groups = {g.name: g for g in view.side_groups}
    assert set(groups) == {"swa.k", "swa.v"} and groups["swa.k"].index_space == "swa_token"
    for j, layer_id in enumerate(groups["swa.k"].layer_ids):
        assert groups["swa.k"].tensors[j].data_ptr() == pool.get_key_buffer(layer_id).data_ptr()


def test_swa_pool_with_mha_sub_pools_refuses_kind_mla_like_the_seed():
    with pytest.raises(InconsistentLayersError, match="Layer 1 is not backed by an MLA KV pool.*MHATokenToKVPool"):
        adapt(swa(), kind="mla", hybrid="attention_only")


def test_hybrid_linear_pool_with_mamba_state():
    pool = mamba_hybrid()
    with pytest.raises(HybridPoolError, match="mamba.conv\\[0\\].*mamba.temporal"):
        adapt(pool)
    view = adapt(pool, hybrid="attention_only")
    assert view.layer_ids == [2, 5]
    for i, layer_id in enumerate(view.layer_ids):
        _assert_write_through(view.k_buffer[i], pool.get_key_buffer(layer_id))
    groups = {g.name: g for g in view.side_groups}
    cache = pool.mamba_pool.mamba_cache
    assert groups["mamba.temporal"].tensors[0] is cache.temporal
    assert groups["mamba.conv[0]"].tensors[0] is cache.conv[0]
    assert groups["mamba.temporal"].layer_ids == (0, 1, 3) and groups["mamba.temporal"].index_space == "mamba_slot"


def test_minimax_sparse_pool():
    pool = minimax(size=64, k_only=True)
    with pytest.raises(HybridPoolError, match="index_k_pool \\(layers \\[2\\]\\) holds K without V"):
        adapt(pool)  # the K-only index has no exact layer-group registration (test_sglang_whole.py)
    view = adapt(pool, hybrid="attention_only")
    assert view.layer_ids == [0, 1, 2]
    groups = {g.name: g.layer_ids for g in view.side_groups}
    assert groups == {"index_kv.k": (1,), "index_kv.v": (1,), "index_k.k": (2,)}
    _assert_write_through(view.k_buffer[2], pool.main_pool.get_key_buffer(2))


def test_fp4_pool_registers_its_scale_planes_or_is_refused():
    pool = mp().MHATokenToKVPoolFP4(
        size=64, page_size=16, dtype=torch.float4_e2m1fn_x2, head_num=4, head_dim=32, layer_num=2, **KW
    )
    with pytest.raises(HybridPoolError, match="hybrid='error' asks for the KV alone"):
        adapt(pool, hybrid="error")  # what the SGLang plugin asks for: FlexKV's connectors register the KV alone
    view = adapt(pool)
    assert view.dtype == torch.uint8 and view.k_buffer[0].shape == (80, 4, 16)
    assert [p.name for p in view.whole.planes] == ["k_scale_buffer/v_scale_buffer"]


def test_k_only_pool_is_refused():
    pool = mp().MHATokenToKOnlyPool(
        size=64, page_size=16, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=2, **KW
    )
    with pytest.raises(UnsupportedPoolError, match="MHATokenToKOnlyPool is a K-only pool \\(no v_buffer\\)"):
        adapt(pool)


def test_head_major_pool_is_refused(monkeypatch):
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1")
    pool = mp().MHATokenToKVPool(size=64, page_size=16, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=2, **KW)
    assert pool.kv_cache_layout == "hnd" and pool.k_buffer[0].shape == (5, 4, 16, 8)
    with pytest.raises(NotAddressableError, match="head-major"):
        adapt(pool)


def test_hisparse_pools_are_refused():
    from sglang.srt.mem_cache.hisparse_memory_pool import HiSparseDSATokenToKVPool

    pool = HiSparseDSATokenToKVPool(**DSA_ARGS)
    with pytest.raises(UnsupportedPoolError, match="HiSparse pool"):
        adapt(pool)


def test_hisparse_mha_main_pool_is_refused_before_its_mapping_is_registered():
    from sglang.srt.mem_cache.hisparse_memory_pool import HiSparseMHAMainPool

    try:
        pool = HiSparseMHAMainPool(
            size=64, page_size=16, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=2, **KW
        )
    except TypeError as exc:  # constructor arguments differ between releases
        pytest.skip(f"HiSparseMHAMainPool signature: {exc}")
    with pytest.raises(UnsupportedPoolError, match="HiSparse pool"):
        adapt(pool)
