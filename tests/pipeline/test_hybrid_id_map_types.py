"""A wrapper's id mapping that is present but no mapping is refused, not skipped.

``full_attention_layer_id_mapping`` (or MiniMax's ``index_kv_layer_id_mapping``) given as a list of
pairs, a list of ids, a set or a string was ignored: the attention layers were labelled 0..n-1, over
the Mamba layers' ids, and FlexKV stored them under the wrong layer ids. adapt() and plan() alike.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings

from flexkv_adapter import InconsistentLayersError, adapt

from ..hybrid_agreement import agreement
from ..strategies.hybrids import _mha
from ..strategies.wrappers import _mamba, unreadable_id_maps

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SOME
@given(unreadable_id_maps())
@pytest.mark.parametrize("mode", [None, "attention_only"])
def test_an_id_map_that_is_no_mapping_is_refused_not_replaced_by_0_to_n(mode, case):
    pool, attr = case
    options = {} if mode is None else {"hybrid": mode}
    adapted, _ = agreement(pool, options)
    assert adapted[0] == "refused", f"{attr}={getattr(pool, attr)!r} read as layers {adapted[1].layer_ids}"
    assert adapted[1] is InconsistentLayersError and attr in adapted[2], adapted[2]


def test_control_a_real_mapping_labels_the_layers():
    pool = SimpleNamespace(
        full_kv_pool=_mha([2, 5], claim=False), full_attention_layer_id_mapping={2: 0, 5: 1}, mamba_pool=_mamba([0, 1])
    )
    assert adapt(pool, hybrid="attention_only").layer_ids == [2, 5]
