"""The SGLang plugin's checks on a view it hands to FlexKV's own connector (no SGLang needed)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import InconsistentLayersError, adapt
from flexkv_adapter.integrations.sglang.checks import ConnectorFacts, check_view

from ...helpers import SGLangLikeMHAPool, SGLangLikeMLAPool, flexkv_tp_roundtrip


def _facts(kind: str, tp: int, total: int, head_size: int) -> ConnectorFacts:
    return ConnectorFacts(kind, "test", 2, "layers 0..1", total, head_size, tp, kv_heads_is_shared_switch=True)


def _connector_layout(view, page: int) -> dict:
    """What FlexKV's SGLang connector registers: per-rank heads in num_kv_heads (1 = shared)."""
    t = view.tensors()[0]
    kv_dim = 1 if view.kind == "mla" else 2
    fields = dict(type="LAYERFIRST", num_layer=2, num_block=t.shape[0] // page, tokens_per_block=page)
    return dict(fields, num_head=t.shape[1], head_size=t.shape[2], kv_dim=kv_dim, num_kv_heads=t.shape[1])


@pytest.mark.parametrize(
    ("kind", "dim", "tp", "ok"),
    [
        ("mla", 576, 16, False),
        ("mla", 576, 8, True),
        ("mha", 72, 4, False),
        ("mha", 72, 8, False),
        ("mha", 64, 8, True),
    ],
)
def test_shared_kv_whose_shards_would_be_truncated_is_refused(kind, dim, tp, ok, monkeypatch):
    """Shared KV (MLA, or MQA: one head in the model) at attention TP > 1: FlexKV's default sharded D2H has
    each rank copy chunk/tp bytes in 8-byte words; fp8 MLA rows of 576 B at page 1 and TP 16 lose 4 of every
    36 bytes. The plugin hands the view to FlexKV's own connector, so it must refuse that itself."""
    monkeypatch.delenv("FLEXKV_KV_SHARED_ACROSS_RANKS_MODE", raising=False)
    if kind == "mla":
        pools = [SGLangLikeMLAPool(4, 1, torch.uint8, dim - 64, 64, 2) for _ in range(tp)]
    else:
        pools = [SGLangLikeMHAPool(4, 1, torch.uint8, 1, dim, 2) for _ in range(tp)]
    views = [adapt(p, page_size=1, kind=kind) for p in pools]
    ranks = [(_connector_layout(v, 1), v.tensors()) for v in views]
    restored = flexkv_tp_roundtrip(ranks, 1)
    tensors = views[0].tensors()  # page 1: block b is row b
    lossless = all(
        got == bytes(tensors[kv * 2 + layer][block].flatten().tolist())
        for (layer, kv, block), got in restored[0].items()
    )
    assert lossless == ok  # FlexKV's reference model: what the connector would register loses bytes
    if ok:
        check_view(views[0], _facts(kind, tp, 1, dim), 1)
    else:
        with pytest.raises(InconsistentLayersError, match="truncated"):
            check_view(views[0], _facts(kind, tp, 1, dim), 1)
    monkeypatch.setenv("FLEXKV_KV_SHARED_ACROSS_RANKS_MODE", "rank0_only")
    check_view(views[0], _facts(kind, tp, 1, dim), 1)


def _connector_facts(kv_cache_dtype: str, model_dtype=torch.bfloat16):
    from types import SimpleNamespace

    from flexkv_adapter.integrations.sglang.checks import FlexKVApi, connector_facts

    model = SimpleNamespace(num_hidden_layers=2, head_dim=8, dtype=model_dtype, get_total_num_kv_heads=lambda: 2)
    server = SimpleNamespace(tp_size=1, kv_cache_dtype=kv_cache_dtype)
    return connector_facts(model, server, 0, FlexKVApi(False, False, False))


@pytest.mark.parametrize(
    ("kv_cache_dtype", "env", "pool_dtype", "ok"),
    [
        ("fp8_e5m2", None, torch.float8_e5m2, False),  # FlexKV maps names it does not know to bfloat16
        ("fp8_e4m3", None, torch.float8_e4m3fn, True),
        ("auto", None, torch.bfloat16, True),
        ("auto", "fp8", torch.bfloat16, False),  # FLEXKV_KV_CACHE_DTYPE outranks the engine's dtype
        ("fp8_e5m2", "fp8", torch.float8_e5m2, True),
    ],
)
def test_a_flexkv_dtype_of_another_element_size_is_refused(kv_cache_dtype, env, pool_dtype, ok, monkeypatch):
    """FlexKV computes GPU strides with its ModelConfig.dtype (FlexKVConfig._resolve_dtype): SGLang's
    --kv-cache-dtype fp8_e5m2 is not in its table and becomes bfloat16, twice the pool's 1-byte elements."""
    monkeypatch.delenv("FLEXKV_CONFIG_PATH", raising=False)
    if env is None:
        monkeypatch.delenv("FLEXKV_KV_CACHE_DTYPE", raising=False)
    else:
        monkeypatch.setenv("FLEXKV_KV_CACHE_DTYPE", env)
    view = adapt(SGLangLikeMHAPool(8, 4, pool_dtype, 2, 8, 2), page_size=4)
    facts = _connector_facts(kv_cache_dtype)
    if ok:
        check_view(view, facts, 4)
    else:
        with pytest.raises(InconsistentLayersError, match="FLEXKV_KV_CACHE_DTYPE"):
            check_view(view, facts, 4)
    monkeypatch.setenv("FLEXKV_CONFIG_PATH", "/nonexistent/flexkv.yml")  # FlexKV reads the dtype from that file
    check_view(view, _connector_facts(kv_cache_dtype), 4)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["mla", "mha"]),
    dim=st.sampled_from([8, 24, 40, 72, 136, 576, 656]),
    page=st.sampled_from([1, 2, 4, 16]),
    tp=st.sampled_from([2, 3, 4, 8, 16]),
    dtype=st.sampled_from([torch.uint8, torch.bfloat16]),
)
def test_shared_kv_check_view_accepts_restores_every_byte(kind, dim, page, tp, dtype):
    """MLA, or MQA (one KV head in the model), through FlexKV's sharded D2H at any TP: accepted means lossless."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLEXKV_KV_SHARED_ACROSS_RANKS_MODE", raising=False)
        if kind == "mla":
            pools = [SGLangLikeMLAPool(2 * page, page, dtype, dim - 8, 8, 2) for _ in range(tp)]
        else:
            pools = [SGLangLikeMHAPool(2 * page, page, dtype, 1, dim, 2) for _ in range(tp)]
        views = [adapt(p, page_size=page, kind=kind) for p in pools]
        facts = ConnectorFacts(kind, "", 2, "", 1, dim, tp, True, dtype.itemsize, "")
        try:
            check_view(views[0], facts, page)
        except InconsistentLayersError:
            return
    restored = flexkv_tp_roundtrip([(_connector_layout(v, page), v.tensors()) for v in views], 1)
    tensors = views[0].tensors()
    for (layer, kv, block), got in restored[0].items():
        rows = tensors[kv * 2 + layer][block * page : (block + 1) * page]
        assert got == bytes(rows.contiguous().view(torch.uint8).flatten().tolist()), (layer, kv, block)
