"""A hybrid wrapper over a DSA child never leaves the child's indexer out unnamed.

A SWA or linear-attention wrapper whose attention sub-pool is DSA: the child's indexer
(``index_k_with_scale_buffer``) is read by the attention layers FlexKV receives, yet the wrapper does not
expose it. It was neither offloaded nor listed; with no Mamba pool the KV alone was handed out under the
default policy. adapt() and plan() agree (checked by ``agreement``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings

from flexkv_adapter import adapt
from flexkv_adapter.model.hybrid import HybridPoolError

from ..hybrid_agreement import agreement
from ..strategies.hybrids import _mla
from ..strategies.wrappers import _mamba, wrappers_with_a_dsa_child

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SOME
@given(wrappers_with_a_dsa_child())
@pytest.mark.parametrize("mode", [None, "error", "attention_only"])
def test_a_dsa_childs_indexer_is_never_left_out_unlisted(mode, case):
    pool, indexed = case
    options = {} if mode is None else {"hybrid": mode}
    adapted, _ = agreement(pool, options)
    index = [t for t in pool.full_kv_pool.index_k_with_scale_buffer if t.numel()]
    if adapted[0] == "refused":
        assert adapted[1] is HybridPoolError and "index_k_with_scale_buffer" in adapted[2], adapted[2]
        return
    view = adapted[1]
    assert mode == "attention_only", f"the KV alone handed out under hybrid={mode}: {view.report}"
    listed = [g for g in view.side_groups if g.name.endswith("index_k_with_scale_buffer")]
    assert len(listed) == 1 and {t.data_ptr() for t in listed[0].tensors} == {t.data_ptr() for t in index}
    assert listed[0].layer_ids == indexed
    assert {lid for lid, _ in view.report.excluded_layers} >= set(indexed)


def test_control_a_wrapper_over_a_plain_mla_child_lists_no_indexer():
    pool = SimpleNamespace(
        full_kv_pool=_mla([2, 5]), full_attention_layer_id_mapping={2: 0, 5: 1}, mamba_pool=_mamba([0, 1])
    )
    view = adapt(pool, hybrid="attention_only")
    assert view.layer_ids == [2, 5] and [g.name for g in view.side_groups] == ["mamba.conv[0]", "mamba.temporal"]
