"""What cannot go whole is refused by name; registration sends exactly what FlexKV's worker expects, or nothing."""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import PlanError, adapt
from flexkv_adapter.errors import FlexKVUnavailableError
from flexkv_adapter.flexkv import check_for_flexkv_connector, register
from flexkv_adapter.flexkv.plan import plan
from flexkv_adapter.model.hybrid import HybridPoolError

from ..multigroup_worker import Client, Worker
from .pools import KW, dsa, fp4, mamba_hybrid, minimax, mp, swa
from .test_sglang_whole import CASES
from .whole_pools import SRC, connector_dsa_call, model_config


@pytest.mark.parametrize("case", CASES)
def test_attention_only_is_refused_where_the_whole_pool_can_be_offloaded(case):
    factory, plane = CASES[case]
    with pytest.raises(HybridPoolError, match="can be offloaded whole") as err:
        adapt(factory(), hybrid="attention_only")
    assert plane in str(err.value) and "restore it without them" in str(err.value)


def test_dsa_kpool_compress_tails_are_refused_by_name():
    pool = mp().DSATokenToKVPool(
        size=256, page_size=128, kv_lora_rank=24, dtype=torch.bfloat16, qk_rope_head_dim=8, layer_num=2,
        index_head_dim=128, kv_cache_dim=32, index_kpool=2, index_kpool_compress=True, max_running_requests=4, **KW,
    )  # fmt: skip
    with pytest.raises(HybridPoolError, match="_compress_tail_k.*one row per request slot.*slot-addressed"):
        adapt(pool)


def test_minimax_k_only_index_is_refused_and_attention_only_keeps_its_meaning():
    with pytest.raises(HybridPoolError, match="index_k_pool \\(layers \\[2\\]\\).*no exact registration"):
        adapt(minimax(k_only=True))
    view = adapt(minimax(k_only=True), hybrid="attention_only")
    assert view.whole is None and {g.name for g in view.side_groups} == {"index_kv.k", "index_kv.v", "index_k.k"}


@pytest.mark.parametrize(
    ("factory", "lacks"),
    [(swa, "no SWA channel"), (mamba_hybrid, "no slot-addressed state channel")],
    ids=["swa", "mamba"],
)
def test_swa_and_mamba_hybrids_keep_refusing_naming_what_flexkv_lacks(factory, lacks):
    with pytest.raises(HybridPoolError, match=lacks):
        adapt(factory())


def test_plan_is_pure_and_flexkv_layer_groups_need_flexkv(no_flexkv):
    p = plan(adapt(dsa(skip=[False, True, False])))
    assert [g.name for g in p.groups] == ["KV", "index_k_with_scale_buffer"]
    index = p.groups[1]
    assert (index.layer_indices, index.head_size, index.compress_ratio, index.tokens_per_block) == ((0, 2), 132, 1, 64)
    with pytest.raises(FlexKVUnavailableError):
        p.flexkv_layer_groups()


def test_registration_matches_flexkvs_multi_group_call(fake_flexkv):
    pool = dsa(kpool=2)
    p = plan(adapt(pool))
    client = Client()
    register(p, client, model_config=model_config(p), attempts=1)
    call = client.calls[0]
    index = pool.index_k_with_scale_buffer
    assert [t.data_ptr() for t in call["kv_caches"]] == [t.data_ptr() for t in (*pool.kv_buffer, *index)]
    assert [[t.data_ptr() for t in g] for g in call["handles_per_group"]] == [
        [t.data_ptr() for t in pool.kv_buffer],
        [t.data_ptr() for t in index],
    ]
    spec = call["layer_groups"][1]
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size, spec.layer_indices) == (2, 1, 132, [0, 1])
    assert (spec.dtype, spec.compress_ratio) == (torch.uint8, 2)
    layout = call["gpu_layouts"][1]
    assert (layout.tokens_per_block, layout.head_size, layout.kv_dim, layout.num_block) == (64, 132, 1, 3)
    assert call["gpu_layouts"][0] == call["kv_layout"] == p.to_flexkv()


def _other_groups(p):
    kv, _ = p.flexkv_layer_groups()
    return model_config(p, [kv, type(kv)(2, 1, 4, [0, 1], torch.uint8, 1)])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (lambda p: None, "registers 2 FlexKV layer groups; pass model_config="),
        (lambda p: model_config(p, None), "model_config.layer_groups = \\[None\\] but this pool registers \\[\\{"),
        (_other_groups, "'head_size': 4.* but this pool registers .*'head_size': 8, 'layer_indices'"),
    ],
    ids=["no-model-config", "no-layer-groups", "other-layer-groups"],
)
def test_a_model_config_without_these_layer_groups_is_refused_before_sending(fake_flexkv, config, message):
    p = plan(adapt(fp4()))
    client = Client()
    with pytest.raises(PlanError, match=message):
        register(p, client, model_config=config(p), attempts=1)
    assert client.calls == []


def test_single_group_pools_register_exactly_as_before(fake_flexkv):
    pool = mp().MHATokenToKVPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=2, **KW)
    view = adapt(pool)
    p = plan(view)
    client = Client()
    register(p, client, model_config=model_config(p, None), attempts=1)
    call = client.calls[0]
    assert p.groups == () and call["layer_groups"] is call["gpu_layouts"] is call["handles_per_group"] is None
    assert [t.data_ptr() for t in call["kv_caches"]] == [t.data_ptr() for t in view.tensors()]
    with pytest.raises(PlanError, match="registers \\[None\\]"):
        register(p, client, model_config=model_config(p, plan(adapt(fp4())).flexkv_layer_groups()), attempts=1)


def test_flexkvs_own_dsa_indexer_registration_overruns_in_the_worker_standin(fake_flexkv):
    """The stand-in catches the bug FlexKV's connector has (connector.py:1824-1831, 1996-2006)."""
    call = connector_dsa_call(dsa())
    worker = Worker(call, call["layer_groups"], num_cpu_blocks=len(SRC))
    with pytest.raises(AssertionError, match="bytes past the end of a registered buffer"):
        worker.d2h(SRC, list(range(len(SRC))))


def test_a_whole_view_is_refused_for_flexkvs_own_connector():
    view = adapt(fp4())
    with pytest.raises(PlanError, match="register the KV alone.*flexkv.register"):
        check_for_flexkv_connector(view, model_config(plan(view), None))
