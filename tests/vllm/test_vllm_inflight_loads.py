"""vLLM 0.34's ``--max-num-inflight-kv-loads`` with FlexKV's connector, on vLLM's real Scheduler: FlexKV's loads
count against the cap and start one at a time, each into the right blocks.

The connector keeps vLLM's ``may_load_async`` (base.py 0.34: 639-649, true only for P/D remote prefills), so a
FlexKV hit waits in vLLM's plain waiting queue and its load starts when a running slot is free, as without the
option; the cap then holds a second load back (sched 0.34: 1325-1333) after FlexKV matched it, and FlexKV cancels
that unlaunched match (adp:424, tasks_to_cancel) and matches again at the next admission.
"""

from __future__ import annotations

import pytest

from .engine import Engine, flexkv_empty
from .test_vllm_lifecycle_loads import A, new_schedules

C = list(range(500, 548))  # three blocks, stored in FlexKV by request C
EXTRA = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.fixture(autouse=True)
def _needs_the_option():
    from vllm.config import SchedulerConfig

    if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
        pytest.skip("this vLLM has no --max-num-inflight-kv-loads (vLLM 0.34 added it)")


def two_hits(plugged, tmp_path, cap: int | None) -> tuple[Engine, list[int], dict[str, bool]]:
    """A and C stored in FlexKV and forgotten by vLLM; B and D (their prefixes + 8) added together and stepped
    until both ran. Returns the engine, the requests waiting for a FlexKV load after each step, and whether each
    of B and D held its prefix's KV when it started to run."""
    engine = Engine(plugged, tmp_path, scheduler_settings={"max_num_inflight_kv_loads": cap})
    engine.serve("A", A)
    engine.serve("C", C)
    engine.forget_local()
    prefixes = {"B": A, "D": C}
    requests = {r: engine.add(r, [*p, *EXTRA]) for r, p in prefixes.items()}
    loading, held = [], {}
    for _ in range(30):
        if len(held) == 2:
            break
        engine.step()
        assert not engine.scheduler.async_kv_waiting  # may_load_async: FlexKV hits never queue as early loads
        loading.append(sum(r.status.name == "WAITING_FOR_REMOTE_KVS" for r in engine.scheduler.requests.values()))
        for r, request in requests.items():
            if r not in held and request.status.name == "RUNNING":
                held[r] = engine.holds(r, prefixes[r], 3)
    return engine, loading, held


def test_with_the_inflight_cap_flexkv_hits_load_in_turn_and_hold_the_right_kv(plugged, tmp_path):
    engine, loading, held = two_hits(plugged, tmp_path, cap=1)
    assert max(loading) == 1 and held == {"B": True, "D": True}
    assert new_schedules(engine, "B") == new_schedules(engine, "D") == [48]  # both admitted with FlexKV's blocks
    engine.run(engine.idle)
    assert engine.finished["B"].name == engine.finished["D"].name == "LENGTH" and flexkv_empty(engine)


def test_negative_control_without_the_cap_both_loads_are_in_flight_together(plugged, tmp_path):
    _, loading, held = two_hits(plugged, tmp_path, cap=None)
    assert max(loading) == 2 and held == {"B": True, "D": True}  # what the cap's test sees if the cap holds none


def test_negative_control_a_broken_registration_under_the_cap_loads_other_bytes(plugged, tmp_path):
    from flexkv.server.client import REGISTRATIONS

    engine = Engine(plugged, tmp_path, scheduler_settings={"max_num_inflight_kv_loads": 1})
    engine.serve("A", A)
    engine.forget_local()
    REGISTRATIONS[-1]["kv_caches"].reverse()  # FlexKV now writes layer 0's bytes into layer 2
    b = engine.add("B", [*A, *EXTRA])
    engine.run(lambda: b.status.name == "RUNNING")
    assert not engine.holds("B", A, 3)
