"""Whole-pool geometries through FlexKV's real multi-group worker and CPU sizing (skipped without FlexKV).

FlexKV's own ``KVCacheLayout`` sizes the CPU block, its ``_init_multi_group``
places each group in it, and the kernel stand-in faults on a misaligned 16-byte access.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt, gate
from flexkv_adapter.flexkv import plan

from ..pipeline.test_hybrid_whole_geometry import dsa_like, mla_fp4_like
from .real_flexkv import needs_flexkv
from .whole_pools import roundtrip

pytestmark = needs_flexkv
FEW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _through_flexkv(pool: object) -> list[str]:
    """Round trip through the real worker; FlexKV's two CPU block sizings must equal the groups' bytes."""
    from .real_worker import RealWorker, flexkv_worker_module

    with flexkv_worker_module() as module:
        from flexkv.common.config import block_size_in_bytes_for_cache

        p = plan(adapt(pool))
        sizes = sum(len(g.layer_indices) * g.kv_dim * g.chunk_bytes for g in p.groups)
        model = SimpleNamespace(layer_groups=p.flexkv_layer_groups(), tp_size=1, kv_dim=p.kv_dim, dtype=p.dtype)
        assert block_size_in_bytes_for_cache(model, SimpleNamespace(tokens_per_block=p.tokens_per_block)) == sizes
        workers: list[RealWorker] = []

        def make(call, layer_groups, blocks):  # type: ignore[no-untyped-def]
            workers.append(RealWorker(module, call, layer_groups, blocks))
            return workers[-1]

        wrong = roundtrip(pool, reader=lambda _: [], make_worker=make)
        assert workers[0].cpu.shape[1] == sizes
        return wrong


@FEW
@given(page=st.sampled_from([2, 4, 6, 16]), layers=st.integers(1, 3))
def test_mla_fp4_like_through_flexkv_round_trips_or_is_refused(page, layers):
    try:
        plan(adapt(mla_fp4_like(page, layers)))
    except AdapterError:
        return
    assert _through_flexkv(mla_fp4_like(page, layers)) == []


@FEW
@given(page=st.sampled_from([2, 8, 64]), layers=st.integers(1, 3), kpool=st.sampled_from([1, 2]), data=st.data())
def test_dsa_like_through_flexkv_round_trips_or_is_refused(page, layers, kpool, data):
    skip = tuple(data.draw(st.lists(st.booleans(), min_size=layers, max_size=layers)))
    pool = dsa_like(page, layers, kpool, data.draw(st.sampled_from([12, 64, 128])), skip, 3)
    try:
        if not plan(adapt(pool)).groups:
            return
    except AdapterError:
        return
    assert _through_flexkv(pool) == []


def test_without_the_alignment_rule_flexkvs_worker_faults(monkeypatch):
    # the negative control: the one packing rule off where adapt() and plan() ask it (flexkv_adapter.gate)
    monkeypatch.setattr(gate, "packing_problem", lambda *a: None)
    with pytest.raises(AssertionError, match="misaligned address"):
        _through_flexkv(mla_fp4_like(2, 1))
