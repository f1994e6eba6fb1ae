"""The whole-pool registrations through FlexKV's real transfer worker (found by ``tests.flexkv_source``).

Skipped, with the reason, when no FlexKV is found; ``FLEXKV_SOURCE=/path/to/FlexKV`` picks another checkout.
"""

from __future__ import annotations

import pytest

from .pools import dsa
from .real_flexkv import needs_flexkv
from .test_sglang_whole import CASES
from .whole_pools import SRC, connector_dsa_call, roundtrip

pytestmark = needs_flexkv


@pytest.mark.parametrize("case", CASES)
def test_round_trip_through_flexkvs_real_multi_group_worker(case):
    from .real_worker import RealWorker, flexkv_worker_module

    factory, plane = CASES[case]
    with flexkv_worker_module() as module:
        make = lambda call, groups, blocks: RealWorker(module, call, groups, blocks)  # noqa: E731
        assert roundtrip(factory(), make_worker=make) == []
        assert roundtrip(factory(), drop=plane, make_worker=make) != []


def test_flexkvs_own_dsa_indexer_registration_overruns_in_flexkvs_real_worker():
    from .real_worker import RealWorker, flexkv_worker_module

    with flexkv_worker_module() as module:
        call = connector_dsa_call(dsa())
        worker = RealWorker(module, call, call["layer_groups"], len(SRC))
        with pytest.raises(AssertionError, match="bytes past the end of a registered buffer"):
            worker.d2h(SRC, list(range(len(SRC))))
