"""num_kv_heads against FlexKV's ModelConfig (consumers §1): every case of the table, on the TP reference model.

Each case builds one pool per TP rank, plans each rank, and offloads/restores every (layer, kv,
block) through ``flexkv_tp_roundtrip`` (FlexKV's per-rank CPU offsets and sharded D2H). The plan's
value must restore every rank exactly; the values FlexKV's own connectors (or a wrong ModelConfig)
would use must not, which is why the plan refuses them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import AmbiguousLayoutError, NotAddressableError, PlanError, adapt
from flexkv_adapter.flexkv import check_against_model_config, check_for_flexkv_connector, plan

from ..helpers import SGLangLikeMHAPool, SGLangLikeMLAPool, flexkv_tp_roundtrip, flexkv_worker_read

L, PS, D = 2, 4, 8


def _ranks(tp: int, heads: int, owner=lambda rank: rank, dtype=torch.bfloat16, dim: int = D, page: int = PS):
    """One pool per rank; ``owner(rank)`` picks which data a rank holds (equal owners: identical KV)."""
    pools = []
    for rank in range(tp):
        pool = SGLangLikeMHAPool(3 * page, page, dtype, head_num=heads, head_dim=dim, layer_num=L)
        for t in pool.k_buffer + pool.v_buffer:
            t.add_(37 * owner(rank))
        pools.append(pool)
    return pools


def _model(tp: int, heads: int, *, layers: int = L, head_size: int = D, dtype=torch.bfloat16, **extra):
    return dict(num_layers=layers, num_kv_heads=heads, head_size=head_size, dtype=dtype, tp_size=tp, **extra)


def _restores(plans, model_heads: int, **kw) -> bool:
    ranks = [(p.layout_fields(), list(p.tensors)) for p in plans]
    try:
        restored = flexkv_tp_roundtrip(ranks, model_heads, **kw)
    except AssertionError:  # FlexKV asserts (div_head) or writes outside its CPU cache
        return False
    keys = list(restored[0])
    return all(r[k] == flexkv_worker_read(f, ts, *k) for r, (f, ts) in zip(restored, ranks) for k in keys)


def _with_heads(plans, value: int):
    return [
        SimpleNamespace(layout_fields=lambda p=p: {**p.layout_fields(), "num_kv_heads": value}, tensors=p.tensors)
        for p in plans
    ]


@pytest.mark.parametrize("cpu_layout", ["BLOCKFIRST", "LAYERFIRST"])
def test_gqa_split_across_ranks_registers_the_total(cpu_layout):
    pools, model = _ranks(tp=2, heads=2), _model(tp=2, heads=4)
    plans = [plan(adapt(p), model_config=model) for p in pools]
    assert {p.num_kv_heads for p in plans} == {4}
    assert _restores(plans, 4, cpu_layout=cpu_layout)
    assert not _restores(plans, 2, cpu_layout=cpu_layout)  # a ModelConfig that counts per rank corrupts
    with pytest.raises(PlanError, match="model_config.num_kv_heads=2 does not match 2 head\\(s\\) per rank"):
        plan(adapt(pools[0]), model_config=_model(tp=2, heads=2))


@pytest.mark.parametrize("cpu_layout", ["BLOCKFIRST", "LAYERFIRST"])
def test_one_head_per_rank_split_registers_the_total_not_the_per_rank_one(cpu_layout):
    pools = _ranks(tp=4, heads=1)
    plans = [plan(adapt(p), model_config=_model(tp=4, heads=4)) for p in pools]
    assert {(p.num_head, p.num_kv_heads, p.kv_dim) for p in plans} == {(1, 4, 2)}
    assert _restores(plans, 4, cpu_layout=cpu_layout)
    # What FlexKV's own connectors register (the per-rank 1) reads as "shared" and corrupts KV.
    assert not _restores(_with_heads(plans, 1), 4, cpu_layout=cpu_layout)
    assert plan(adapt(pools[0]), tp_size=4, total_kv_heads=4).num_kv_heads == 4


@pytest.mark.parametrize("mode", ["sharded", "rank0_only"])
def test_mqa_every_rank_identical_registers_one(mode):
    pools = _ranks(tp=4, heads=1, owner=lambda rank: 0)
    plans = [plan(adapt(p), model_config=_model(tp=4, heads=1)) for p in pools]
    assert {p.num_kv_heads for p in plans} == {1}
    assert _restores(plans, 1, mode=mode)
    assert plan(adapt(pools[0]), tp_size=4, total_kv_heads=1).num_kv_heads == 1
    # The total (= tp) against a ModelConfig of 1: div_head asserts (BLOCKFIRST) or KV is corrupted.
    assert not _restores(_with_heads(plans, 4), 1)
    assert not _restores(_with_heads(plans, 4), 1, cpu_layout="LAYERFIRST")
    with pytest.raises(PlanError, match="total_kv_heads=4 contradicts model_config.num_kv_heads=1"):
        plan(adapt(pools[0]), model_config=_model(tp=4, heads=1), total_kv_heads=4)


def test_mqa_under_a_config_that_counts_copies_registers_the_copies():
    pools = _ranks(tp=4, heads=1, owner=lambda rank: 0)
    plans = [plan(adapt(p), model_config=_model(tp=4, heads=4)) for p in pools]  # FlexKV's vLLM config
    assert {p.num_kv_heads for p in plans} == {4} and _restores(plans, 4)


def test_one_head_per_rank_without_a_model_config_is_ambiguous():
    pool = _ranks(tp=1, heads=1)[0]
    with pytest.raises(AmbiguousLayoutError, match="total_kv_heads=1 / total_kv_heads=8"):
        plan(adapt(pool), tp_size=8)
    assert plan(adapt(pool)).num_kv_heads == 1  # tp 1: nothing to tell apart


def test_replicated_gqa_is_refused_unless_the_model_config_counts_the_replicas():
    pools = _ranks(tp=4, heads=1, owner=lambda rank: rank // 2)  # 2 KV heads, each on 2 ranks
    for kwargs in ({"model_config": _model(tp=4, heads=2)}, {"tp_size": 4, "total_kv_heads": 2}):
        with pytest.raises(PlanError, match="replicated KV heads.*counts the replicas \\(1 per rank x 4 = 4"):
            plan(adapt(pools[0]), **kwargs)
    # The reason: against FlexKV's SGLang ModelConfig (the total, 2) no registered value restores KV.
    plans = [plan(adapt(p), model_config=_model(tp=4, heads=4)) for p in pools]
    assert not any(
        _restores(_with_heads(plans, v), 2, cpu_layout=c) for v in (1, 2, 4) for c in ("BLOCKFIRST", "LAYERFIRST")
    )
    assert {p.num_kv_heads for p in plans} == {4} and _restores(plans, 4)


def test_replicated_kv_heads_option_is_gone_with_a_pointer_to_model_config():
    with pytest.raises(PlanError, match="model_config="):
        plan(adapt(_ranks(tp=1, heads=1)[0]), tp_size=8, total_kv_heads=2, replicated_kv_heads=True)


def test_mla_is_one_and_needs_a_model_config_of_one():
    pools = [SGLangLikeMLAPool(12, PS, torch.bfloat16, kv_lora_rank=12, qk_rope_head_dim=4, layer_num=L)] * 4
    model = _model(tp=4, heads=1, head_size=16, use_mla=True)
    plans = [plan(adapt(p), model_config=model) for p in pools]
    assert {(p.num_kv_heads, p.kv_dim) for p in plans} == {(1, 1)} and _restores(plans, 1)
    with pytest.raises(PlanError, match="Set ModelConfig.num_kv_heads=1 for MLA"):
        plan(adapt(pools[0]), model_config={**model, "num_kv_heads": 4})
    with pytest.raises(PlanError, match="use_mla=False"):
        plan(adapt(pools[0]), model_config={**model, "use_mla": False})
    with pytest.raises(PlanError, match=r"registers kv_dim=2 but model_config.kv_dim=1"):
        plan(adapt(_ranks(tp=1, heads=2)[0]), model_config=_model(tp=1, heads=2, kv_dim=1))


def test_shared_kv_shards_must_be_whole_words():
    # 656-byte fp8 rows, page 1, tp 8: 82-byte shards lose bytes in FlexKV's 8-byte-word copy.
    pools = _ranks(tp=8, heads=1, owner=lambda rank: 0, dtype=torch.uint8, dim=656, page=1)
    model = _model(tp=8, heads=1, head_size=656, dtype=torch.uint8)
    with pytest.raises(NotAddressableError, match="multiple of 64.*truncated silently"):
        plan(adapt(pools[0]), model_config=model)
    fields = plan(adapt(pools[0])).layout_fields()  # what the refused plan would register (num_kv_heads=1)
    ranks = [(fields, list(adapt(p).tensors())) for p in pools]
    restored = flexkv_tp_roundtrip(ranks, 1)
    assert any(r != flexkv_worker_read(fields, ts, *k) for (_, ts), got in zip(ranks, restored) for k, r in got.items())


def test_shared_kv_shards_are_fine_in_rank0_only_mode(monkeypatch):
    monkeypatch.setenv("FLEXKV_KV_SHARED_ACROSS_RANKS_MODE", "rank0_only")
    pools = _ranks(tp=8, heads=1, owner=lambda rank: 0, dtype=torch.uint8, dim=656, page=1)
    plans = [plan(adapt(p), model_config=_model(tp=8, heads=1, head_size=656, dtype=torch.uint8)) for p in pools]
    assert _restores(plans, 1, mode="rank0_only")


def test_layer_count_must_match_the_model_config_per_stage():
    pool = _ranks(tp=1, heads=2)[0]
    with pytest.raises(PlanError, match="the source has 2 layers but model_config has 24 per pipeline stage"):
        plan(adapt(pool), model_config=_model(tp=1, heads=2, layers=24))
    with pytest.raises(PlanError, match="num_layers_per_pp_stage"):
        plan(adapt(pool), model_config=_model(tp=1, heads=2, layers=4, pp_size=2))
    assert plan(adapt(pool), model_config=_model(tp=1, heads=2, layers=4, pp_size=2, num_layers_per_pp_stage=2))
    with pytest.raises(PlanError, match="head size 8 != model_config.head_size=16"):
        plan(adapt(pool), model_config=_model(tp=1, heads=2, head_size=16))
    with pytest.raises(PlanError, match="FLEXKV_KV_CACHE_DTYPE"):
        plan(adapt(pool), model_config=_model(tp=1, heads=2, dtype=torch.float32))


def test_an_attention_only_hybrid_view_is_refused_against_the_full_model():
    from flexkv_adapter.cli.samples import _swa_pool

    view = adapt(_swa_pool(), hybrid="attention_only")
    first = view.tensors()[0]
    model = _model(tp=1, heads=first.shape[1], layers=5, head_size=first.shape[2], dtype=first.dtype)
    with pytest.raises(PlanError, match=f"the source has {len(view.layer_ids)} layers but model_config has 5"):
        plan(view, model_config=model)
    with pytest.raises(PlanError, match="attention-only hybrid view"):
        check_against_model_config(view, model)


def test_check_against_model_config_for_engine_hooks():
    view = adapt(_ranks(tp=1, heads=1)[0])
    assert check_against_model_config(view, _model(tp=4, heads=4)) == 4
    assert check_against_model_config(view, _model(tp=4, heads=1)) == 1
    with pytest.raises(PlanError, match="tp_size=2 contradicts model_config.tp_size=4"):
        check_against_model_config(view, _model(tp=4, heads=4), tp_size=2)
    p = plan(view, model_config=_model(tp=4, heads=4))
    assert check_against_model_config(p, _model(tp=4, heads=4)) == 4
    with pytest.raises(PlanError, match="re-plan"):
        check_against_model_config(p, _model(tp=4, heads=1))
    real_looking = SimpleNamespace(**_model(tp=4, heads=4), kv_dim=2, pp_size=1)  # FlexKV's ModelConfig fields
    assert check_against_model_config(view, real_looking) == 4


def test_views_flexkvs_own_connector_would_register_wrongly_are_refused_for_it():
    one_per_rank = adapt(_ranks(tp=1, heads=1)[0])
    with pytest.raises(PlanError, match="connector registers num_kv_heads=1"):
        check_for_flexkv_connector(one_per_rank, _model(tp=4, heads=4))
    check_for_flexkv_connector(one_per_rank, _model(tp=4, heads=1))  # MQA: 1 is right
    check_for_flexkv_connector(adapt(_ranks(tp=1, heads=2)[0]), _model(tp=2, heads=4))
    # The connector's value against the reference model: per-rank 1 corrupts, per-rank 2 is read as split.
    pools = _ranks(tp=2, heads=2)
    assert _restores(_with_heads([plan(adapt(p), tp_size=2) for p in pools], 2), 4)


@settings(max_examples=40, deadline=None)
@given(
    tp=st.integers(1, 4),
    per_rank=st.integers(1, 3),
    model=st.sampled_from(["split", "mqa", "replicated"]),
    config=st.sampled_from(["total", "per_rank_x_tp", "wrong"]),
    cpu_layout=st.sampled_from(["BLOCKFIRST", "LAYERFIRST"]),
)
def test_whatever_plan_accepts_restores_every_rank(tp, per_rank, model, config, cpu_layout):
    if model != "split":
        per_rank = 1
    total = {"split": per_rank * tp, "mqa": 1, "replicated": max(1, tp // 2)}[model]
    owner = {"split": lambda r: r, "mqa": lambda r: 0, "replicated": lambda r: r * total // tp}[model]
    heads = {"total": total, "per_rank_x_tp": per_rank * tp, "wrong": total + 1}[config]
    pools = _ranks(tp=tp, heads=per_rank, owner=owner)
    try:
        plans = [plan(adapt(p), model_config=_model(tp=tp, heads=heads)) for p in pools]
    except NotAddressableError as exc:  # shared KV whose 1/tp shards are not whole 8-byte words
        assert "truncated silently" in str(exc) and (PS * per_rank * D * 2) % (8 * tp)
        return
    except PlanError:
        assert config != "per_rank_x_tp"  # the replicas counted: always registrable
        return
    assert _restores(plans, heads, cpu_layout=cpu_layout)
