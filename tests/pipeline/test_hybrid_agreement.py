"""adapt() and plan() never disagree on a pool with state beside its KV: one pipeline, one hybrid policy.

For every kind the policy decides on, with every ``hybrid=``/``kind=``/``page_size=`` a caller may pass
and layer ids written as Python, numpy or 0-d tensor integers (or hostile values): ``plan(pool, **o)``
is exactly ``plan(adapt(pool, **o))`` (the same FlexKV registration, tensor for tensor, or the same error
class), and a refusal by adapt() is a refusal by plan(). The one asymmetry is documented
(docs/hybrids.md): ``hybrid="error"`` on a DSA pool is the KV alone for a connector that reads the
indexer itself; adapt() hands it out, plan(), which would register it without the indexer, refuses.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from flexkv_adapter import InconsistentLayersError, adapt
from flexkv_adapter.errors import NotAddressableError
from flexkv_adapter.flexkv import plan

from ..hybrid_agreement import agreement, is_documented_asymmetry, outcome, tensors_key
from ..strategies.hybrids import HOSTILE_IDS, hybrid_pools
from .test_hybrid_whole_geometry import mla_fp4_like

SOME = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SOME
@given(hybrid_pools())
def test_plan_of_a_pool_is_plan_of_its_adapted_view(case):
    pool, options, notes = case
    adapted, planned = agreement(pool, options)
    context = f"{notes} {options}: adapt {adapted[0]} {adapted[2][:200]} / plan {planned[0]} {planned[2][:200]}"
    if adapted[0] == "ok" and planned[0] == "refused":  # the one documented asymmetry
        assert notes["kind"] == "dsa" and is_documented_asymmetry(adapted, planned, options), context
    if notes["ids"] in HOSTILE_IDS and notes["kind"] in ("swa", "linear", "minimax"):
        assert adapted[0] == "refused", context  # never read as some other id
        if not {"attrs", "kind"} & set(options):  # nothing else to refuse first: the ids are named
            assert adapted[1] is InconsistentLayersError, context


@pytest.mark.parametrize("mode", [None, "error", "attention_only"])
def test_raw_paged_kv_with_scales_is_not_planned_without_them(mode):
    """plan() registered raw paged tensors as they are, past the hybrid policy: their scale planes were dropped."""
    pool = SimpleNamespace(
        kv_buffer=[torch.zeros(4, 4, 8, dtype=torch.bfloat16) for _ in range(2)],
        kv_scale_buffer=[torch.zeros(16, 4, dtype=torch.uint8) for _ in range(2)],
    )
    options = {} if mode is None else {"hybrid": mode}
    adapted, planned = outcome(lambda: adapt(pool, **options)), outcome(lambda: plan(pool, **options))
    assert adapted[0] == planned[0]
    if mode != "attention_only":  # the scales cannot be matched to these pages: refused by name, never dropped
        assert planned[:2] == adapted[:2] and "kv_scale_buffer" in planned[2]
    else:
        assert planned[1].layer_ids == (0, 1) and tensors_key(planned[1].tensors) == tensors_key(adapted[1].tensors())


@pytest.mark.parametrize(("page", "layers"), [(2, 1), (2, 3), (6, 3)])
def test_a_whole_view_flexkv_would_fault_on_is_refused_by_adapt_as_by_plan(page, layers):
    """adapt() handed out whole views whose packed CPU block FlexKV's 16-byte kernel faults on; plan() refused."""
    for call in (adapt, plan):
        with pytest.raises(NotAddressableError, match="packs each CPU block group after group"):
            call(mla_fp4_like(page, layers))
    assert adapt(mla_fp4_like(16, layers)).whole is not None  # 16-byte multiples: offloaded whole


def test_attrs_into_a_wrappers_sub_pool_of_raw_pages_is_labelled_by_the_mapping_in_plan_too():
    """plan() registered raw [P, T, D] pages named by attrs= as they are, labelled 0..n-1, not by the mapping."""
    pages = [torch.zeros(4, 4, 16, dtype=torch.bfloat16) for _ in range(2)]
    full, swa = SimpleNamespace(kv_buffer=pages, page_size=4), SimpleNamespace(kv_buffer=list(pages), page_size=4)
    mapping = {1: (0, False), 4: (1, False), 0: (0, True), 2: (1, True)}
    pool = SimpleNamespace(full_kv_pool=full, swa_kv_pool=swa, layers_mapping=mapping)
    options = {"attrs": ["full_kv_pool.kv_buffer"], "hybrid": "attention_only"}
    adapted, planned = agreement(pool, options)
    assert adapted[1].layer_ids == [1, 4] and planned[1].layer_ids == (1, 4)
