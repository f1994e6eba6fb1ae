"""A wrapper's id mapping must read the same through items(), iteration and [], and on
every read of the attribute.

SGLang looks a layer up with ``mapping[layer_id]``; the adapter read ``mapping.items()``. A dict subclass
whose ``__iter__``/``__getitem__`` disagree with its stored items, or a property that hands out another
dict on each read, gave two readings of which layer sits where, and the adapter silently took one.
Honest Mappings (UserDict, MappingProxyType, a fresh copy of the same dict per read) read as a dict.
"""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, given, settings

from flexkv_adapter import InconsistentLayersError

from ..hybrid_agreement import agreement
from ..strategies.wrappers import mappings_read_two_ways

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SOME
@given(mappings_read_two_ways())
def test_a_mapping_with_two_readings_is_refused_and_an_honest_one_labels_the_layers(case):
    pool, attr, lies, ids = case
    logging.disable(logging.WARNING)
    try:
        adapted, _ = agreement(pool, {"hybrid": "attention_only"})
    finally:
        logging.disable(logging.NOTSET)
    if lies:
        assert adapted[0] == "refused", f"read as layers {adapted[1].layer_ids}"
        assert adapted[1] is InconsistentLayersError and attr in adapted[2], adapted[2]
    else:
        assert adapted[0] == "ok" and tuple(adapted[1].layer_ids) == ids, adapted[2]
