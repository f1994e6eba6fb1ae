"""Every SGLang 0.5.23 hybrid pool class, with MHA and with MLA children, adapted as the README says.

SGLang patches the wrapper's global ids (``model_layer_ids``) onto an MHA child only; an MLA child
keeps its compact default ``range(start_layer, start_layer + layer_num)``. The wrapper's mapping is
the truth for both: the view's ``layer_ids`` are the global ids, and each exposed tensor is the memory
the pool's own getter returns for that global layer (written through the view, read through the pool).
"""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import MHAView, MLAView, adapt
from flexkv_adapter.flexkv import plan
from flexkv_adapter.hybrid import HybridPoolError

from .test_sglang_pools import KW, _assert_write_through, mp

MLA_ARGS = {"kv_lora_rank": 24, "qk_rope_head_dim": 8}


def _mamba(layers: list[int]) -> object:
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


def _hybrid_linear(use_mla: bool, dsa: bool = False) -> object:
    extra: dict[str, object] = {"use_mla": True, **MLA_ARGS} if use_mla else {}
    if dsa:  # DSA children: MLA latent rows plus a paged indexer cache (passed through, as for a plain DSA pool)
        extra.update(use_dsa=True, index_head_dim=128, kv_cache_dim=32)
    return mp().HybridLinearKVPool(
        size=64,
        dtype=torch.bfloat16,
        page_size=64 if dsa else 16,
        head_num=4,
        head_dim=8,
        full_attention_layer_ids=[1, 3],
        device="cpu",
        mamba_pool=_mamba([0, 2]),
        **extra,
    )


def _qsa() -> object:
    from sglang.srt.mem_cache.qsa_kv_pool import QSATokenToKVPool

    return QSATokenToKVPool(
        size=64,
        dtype=torch.bfloat16,
        page_size=16,
        head_num=4,
        head_dim=8,
        full_attention_layer_ids=[1, 3],
        device="cpu",
        mamba_pool=_mamba([0, 2]),
        qsa_index_kv_heads=1,
        qsa_index_head_dim=16,
        qsa_compress_ratio=4,
        qsa_token_topk=8,
        num_request_slots=4,
    )


def test_qsa_index_state_is_listed_with_what_attention_only_leaves_out():
    # The wrapper's own tensors (compressed keys, per-request ring, rope positions) were missing from
    # side_groups, the report and the warning: attention_only dropped them without saying so.
    pool = _qsa()
    with pytest.raises(HybridPoolError, match="qsa_compressed_k_buffer_pool"):
        adapt(pool)
    view = adapt(pool, hybrid="attention_only")
    listed = {t.untyped_storage().data_ptr() for g in view.side_groups for t in g.tensors}
    for attr, value in vars(pool).items():
        tensors = [value] if isinstance(value, torch.Tensor) else value if isinstance(value, list) else []
        for t in (t for t in tensors if isinstance(t, torch.Tensor) and t.numel()):
            assert t.untyped_storage().data_ptr() in listed, attr
    assert any("qsa_key_state_buffer_pool" in g for g in view.report.side_groups)


def _swa(use_mla: bool) -> object:
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    extra: dict[str, object] = {}
    if use_mla:
        child = {"page_size": 16, "device": "cpu", "enable_memory_saver": False, **MLA_ARGS}
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


def _minimax() -> object:
    return mp().MiniMaxSparseKVPool(
        size=64,
        page_size=16,
        dtype=torch.bfloat16,
        head_num=4,
        head_dim=8,
        idx_head_dim=16,
        dense_layer_ids=[0],
        sparse_layer_ids=[1, 2],
        start_layer=0,
        end_layer=3,
        **KW,
    )


CASES = [
    ("hybrid-linear-mha", lambda: _hybrid_linear(False), MHAView, [1, 3]),
    ("hybrid-linear-mla", lambda: _hybrid_linear(True), MLAView, [1, 3]),
    ("hybrid-linear-dsa", lambda: _hybrid_linear(True, dsa=True), MLAView, [1, 3]),
    ("swa-mha", lambda: _swa(False), MHAView, [1, 4]),
    ("swa-mla", lambda: _swa(True), MLAView, [1, 4]),
    ("qsa-mha", lambda: _qsa(), MHAView, [1, 3]),  # a HybridLinearKVPool with QSA index state on the wrapper
]


@pytest.mark.parametrize(("make", "cls", "ids"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hybrid_pools_adapt_with_the_wrappers_global_ids(make, cls, ids):
    pool = make()
    with pytest.raises(HybridPoolError):
        adapt(pool)
    view = adapt(pool, hybrid="attention_only")
    assert isinstance(view, cls) and view.layer_ids == ids and view.source is pool
    for i, layer_id in enumerate(ids):
        if cls is MLAView:
            _assert_write_through(view.kv_buffer[i], pool.get_key_buffer(layer_id))
        else:
            _assert_write_through(view.k_buffer[i], pool.get_key_buffer(layer_id))
            _assert_write_through(view.v_buffer[i], pool.get_value_buffer(layer_id))
    assert plan(view).layer_ids == tuple(ids)


def test_minimax_without_k_only_layers_is_whole_by_default_with_the_wrappers_global_ids():
    # MiniMax's main pool is MHA only (main_pool_cls); its index_kv shares the KV's page ids, so the
    # pool is offloaded whole (docs/hybrids.md) and attention_only, which would drop that plane, is refused.
    pool = _minimax()
    with pytest.raises(HybridPoolError, match="whole"):
        adapt(pool, hybrid="attention_only")
    view = adapt(pool)
    assert isinstance(view, MHAView) and view.whole is not None and view.layer_ids == [0, 1, 2]
    for i, layer_id in enumerate(view.layer_ids):
        _assert_write_through(view.k_buffer[i], pool.get_key_buffer(layer_id))
        _assert_write_through(view.v_buffer[i], pool.get_value_buffer(layer_id))
    assert plan(view).layer_ids == (0, 1, 2) and len(plan(view).groups) == 2


@pytest.mark.parametrize("use_mla", [False, True], ids=["mha", "mla"])
def test_options_that_contradict_the_wrappers_mapping_are_still_refused(use_mla):
    from flexkv_adapter import InconsistentLayersError

    with pytest.raises(InconsistentLayersError, match="layer_ids"):
        adapt(_hybrid_linear(use_mla), hybrid="attention_only", layer_ids=[0, 1])
    with pytest.raises(InconsistentLayersError, match="start_layer"):
        adapt(_hybrid_linear(use_mla), hybrid="attention_only", start_layer=2)


def test_negative_control_a_child_that_claims_other_global_ids_is_refused():
    pool = _hybrid_linear(True)
    pool.full_kv_pool.model_layer_ids = (5, 7)  # not the compact default: a real claim that contradicts
    from flexkv_adapter import InconsistentLayersError

    with pytest.raises(InconsistentLayersError, match="model_layer_ids"):
        adapt(pool, hybrid="attention_only")
