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
from flexkv_adapter.model.hybrid import HybridPoolError

from .pools import hybrid_linear, mamba, minimax, swa
from .test_sglang_pools import _assert_write_through


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
        mamba_pool=mamba([0, 2]),
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


CASES = [
    ("hybrid-linear-mha", lambda: hybrid_linear(False), MHAView, [1, 3]),
    ("hybrid-linear-mla", lambda: hybrid_linear(True), MLAView, [1, 3]),
    ("hybrid-linear-dsa", lambda: hybrid_linear(True, dsa=True), MLAView, [1, 3]),
    ("swa-mha", lambda: swa(False), MHAView, [1, 4]),
    ("swa-mla", lambda: swa(True), MLAView, [1, 4]),
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
    pool = minimax(size=64)
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
        adapt(hybrid_linear(use_mla), hybrid="attention_only", layer_ids=[0, 1])
    with pytest.raises(InconsistentLayersError, match="start_layer"):
        adapt(hybrid_linear(use_mla), hybrid="attention_only", start_layer=2)


def test_negative_control_a_child_that_claims_other_global_ids_is_refused():
    pool = hybrid_linear(True)
    pool.full_kv_pool.model_layer_ids = (5, 7)  # not the compact default: a real claim that contradicts
    from flexkv_adapter import InconsistentLayersError

    with pytest.raises(InconsistentLayersError, match="model_layer_ids"):
        adapt(pool, hybrid="attention_only")
