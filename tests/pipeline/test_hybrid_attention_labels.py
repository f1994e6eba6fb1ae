"""Attention layer labels never name a Mamba or SWA layer.

A linear-attention wrapper with no ``full_attention_layer_id_mapping`` and a child without
``model_layer_ids`` has no record of where its attention layers sit: they were labelled 0..n-1, over
the Mamba layers' ids, and FlexKV stored them under those ids. SWA and Mamba layers are never attention
layers, so a label that names one is refused; ``layer_ids=`` gives the labels.
"""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, given, settings

from flexkv_adapter import InconsistentLayersError

from ..hybrid_agreement import agreement
from ..strategies.wrappers import linear_wrappers_without_attention_ids

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SOME
@given(linear_wrappers_without_attention_ids())
def test_labels_that_name_a_mamba_layer_are_refused_and_layer_ids_fix_them(case):
    pool, full, mamba = case
    logging.disable(logging.WARNING)
    try:
        guessed, _ = agreement(pool, {"hybrid": "attention_only"})
        given_ids, _ = agreement(pool, {"hybrid": "attention_only", "layer_ids": full})
    finally:
        logging.disable(logging.NOTSET)
    assert guessed[0] == "refused", f"labelled {guessed[1].layer_ids} beside Mamba layers {mamba}"
    assert guessed[1] is InconsistentLayersError and "mamba" in guessed[2].lower(), guessed[2]
    assert given_ids[0] == "ok" and list(given_ids[1].layer_ids) == full, given_ids[2]
