"""Hybrid pools without SGLang: wrappers recognised by attributes, side groups, the opt-in policy."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AdapterError, InconsistentLayersError, MLAView, UnsupportedPoolError, adapt
from flexkv_adapter.cli.samples import _hybrid_linear_pool, _minimax_pool, _swa_pool
from flexkv_adapter.model.hybrid import HybridPoolError


def test_swa_wrapper_default_refuses_and_names_what_is_left_out():
    with pytest.raises(HybridPoolError) as err:
        adapt(_swa_pool())
    msg = str(err.value)
    assert isinstance(err.value, UnsupportedPoolError)
    assert "hybrid pool (sglang-swa)" in msg and "attention layers [1, 4]" in msg and "Layers [0, 2, 3]" in msg
    assert "swa_token" in msg and "hybrid='attention_only'" in msg


def test_swa_wrapper_attention_only_maps_global_ids_and_exposes_swa_side_groups(caplog):
    pool = _swa_pool()
    with caplog.at_level(logging.WARNING, logger="flexkv_adapter"):
        view = adapt(pool, hybrid="attention_only")
    assert view.layer_ids == [1, 4] and view.source is pool and not hasattr(view, "layers_mapping")
    assert view.k_buffer[1].data_ptr() == pool.full_kv_pool.k_buffer[1].data_ptr()
    swa_k = next(g for g in view.side_groups if g.name == "swa.k")
    assert swa_k.layer_ids == (0, 2, 3) and swa_k.index_space == "swa_token"
    assert [t.data_ptr() for t in swa_k.tensors] == [t.data_ptr() for t in pool.swa_kv_pool.k_buffer]
    assert sorted({lid for lid, _ in view.report.excluded_layers}) == [0, 2, 3]
    assert any("swa.k" in g for g in view.report.side_groups) and "excluded layers: [0, 2, 3]" in str(view.report)
    assert any("offloading attention layers [1, 4] only" in m for m in caplog.messages)


def test_the_opt_in_also_comes_from_settings(monkeypatch):
    monkeypatch.setenv("FLEXKV_ADAPTER_HYBRID", "attention_only")
    assert adapt(_swa_pool()).layer_ids == [1, 4]
    monkeypatch.setenv("FLEXKV_ADAPTER_HYBRID", "error")
    with pytest.raises(HybridPoolError):
        adapt(_swa_pool())
    assert adapt(_swa_pool(), hybrid="attention_only").layer_ids == [1, 4]  # the argument wins


def test_hybrid_linear_wrapper_exposes_mamba_state_zero_copy():
    pool = _hybrid_linear_pool()
    with pytest.raises(HybridPoolError, match="mamba.conv\\[0\\].*mamba_slot"):
        adapt(pool)
    view = adapt(pool, hybrid="attention_only")
    assert view.layer_ids == [2, 5]
    groups = {g.name: g for g in view.side_groups}
    assert groups["mamba.temporal"].tensors[0] is pool.mamba_pool.mamba_cache.temporal
    assert groups["mamba.conv[0]"].layer_ids == (0, 1, 3)


def test_minimax_wrapper_keeps_all_layers_and_lists_index_planes():
    view = adapt(_minimax_pool(), hybrid="attention_only")
    assert view.layer_ids == [0, 1, 2]
    assert {g.name: g.layer_ids for g in view.side_groups} == {
        "index_kv.k": (1,),
        "index_kv.v": (1,),
        "index_k.k": (2,),
    }


def test_kind_requested_against_the_backing_pool_like_the_seed():
    with pytest.raises(InconsistentLayersError, match="Layer 1 is not backed by an MLA KV pool"):
        adapt(_swa_pool(), kind="mla", hybrid="attention_only")


def test_mla_sub_pools_give_an_mla_view():
    def sub(ids):
        return SimpleNamespace(
            kv_buffer=[torch.zeros(48, 1, 16) for _ in ids], page_size=16, model_layer_ids=tuple(ids)
        )

    pool = SimpleNamespace(
        full_kv_pool=sub([0, 2]), swa_kv_pool=sub([1]), layers_mapping={0: (0, False), 2: (1, False), 1: (0, True)}
    )
    view = adapt(pool, hybrid="attention_only", kind="mla")
    assert isinstance(view, MLAView) and view.layer_ids == [0, 2]
    assert [g.name for g in view.side_groups] == ["swa.kv"]


def test_quantised_scale_planes_are_offloaded_whole_and_attention_only_is_refused():
    pool = SimpleNamespace(
        k_buffer=[torch.zeros(32, 2, 8, dtype=torch.uint8) for _ in range(2)],
        v_buffer=[torch.zeros(32, 2, 8, dtype=torch.uint8) for _ in range(2)],
        k_scale_buffer=[torch.zeros(32, 1, dtype=torch.uint8) for _ in range(2)],
        v_scale_buffer=[torch.zeros(32, 1, dtype=torch.uint8) for _ in range(2)],
        page_size=16,
    )
    view = adapt(pool)
    assert [p.name for p in view.whole.planes] == ["k_scale_buffer/v_scale_buffer"] and not view.side_groups
    assert [t.data_ptr() for t in view.whole.planes[0].tensors] == [
        t.data_ptr() for t in (*pool.k_scale_buffer, *pool.v_scale_buffer)
    ]
    with pytest.raises(HybridPoolError, match="can be offloaded whole.*restore it without them"):
        adapt(pool, hybrid="attention_only")
    with pytest.raises(HybridPoolError, match="hybrid='error' asks for the KV alone"):
        adapt(pool, hybrid="error")


def test_invalid_hybrid_mode():
    with pytest.raises(AdapterError, match="hybrid must be"):
        adapt(_swa_pool(), hybrid="everything")


def test_cross_rank_trim_keeps_side_groups():
    view = adapt(_swa_pool(), hybrid="attention_only")
    trimmed = view.with_num_blocks(2, "test")
    assert trimmed.side_groups == view.side_groups and trimmed.layer_ids == [1, 4]
    assert trimmed.k_buffer[0].shape[0] == 32


def test_a_layer_mapping_that_disagrees_with_the_sub_pool_is_an_error():
    pool = _swa_pool()
    pool.layers_mapping[7] = (2, False)  # a third full layer the full pool does not hold
    with pytest.raises(
        InconsistentLayersError, match="names 3 attention layers \\[1, 4, 7\\] but full_kv_pool holds 2"
    ):
        adapt(pool, hybrid="attention_only")


@pytest.mark.parametrize("build", [_swa_pool, _hybrid_linear_pool], ids=["swa", "linear"])
def test_tensors_the_wrapper_holds_itself_are_listed_not_dropped_silently(build):
    pool = build()
    pool.index_state = [torch.zeros(4, 8), torch.zeros(4, 8)]  # e.g. QSA's compressed keys on the wrapper
    pool.index_flat = pool.index_state[0].view(-1)  # a second view of listed memory: not listed twice
    pool.data_ptrs = torch.zeros(3, dtype=torch.int64)  # SGLang's derived pointer table: not state
    with pytest.raises(HybridPoolError, match="index_state"):
        adapt(pool)
    view = adapt(pool, hybrid="attention_only")
    names = [g.name for g in view.side_groups]
    assert "index_state" in names and "index_flat" not in names and "data_ptrs" not in names
    assert any("index_state" in g for g in view.report.side_groups)
