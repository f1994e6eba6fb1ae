"""The whole-pool registrations through FlexKV's real transfer worker (opt-in: set FLEXKV_SRC to its source).

``git -C <FlexKV clone> archive HEAD flexkv | tar -x -C /tmp/fkv`` then ``FLEXKV_SRC=/tmp/fkv``.
"""

from __future__ import annotations

import os

import pytest

from .pools import dsa
from .test_sglang_whole import CASES
from .whole_pools import SRC, connector_dsa_call, roundtrip

pytestmark = pytest.mark.skipif(not os.environ.get("FLEXKV_SRC"), reason="FLEXKV_SRC (a FlexKV source tree) not set")


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
        with pytest.raises(AssertionError, match="bytes past a buffer"):
            worker.d2h(SRC, list(range(len(SRC))))
