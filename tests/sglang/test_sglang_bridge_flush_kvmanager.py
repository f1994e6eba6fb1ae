"""A flush through FlexKV's REAL KVManager (task engine, radix index, transfer processes; only compiled parts
replaced).

FlexKV 34ab141 pins ``expiring-dict==1.1.2`` (requirements.txt:11) and builds its task table as
``ExpiringDict(max_age_seconds=1800, max_len=100000)`` (kvtask.py:212): 1.1.2's constructor is
``(ttl=None, interval=0.1, *args, **kwargs)``, so the two keywords become two entries holding ints, and
``reset_cache`` (kvtask.py:1446-1489) fails on them (``'int' object has no attribute 'is_completed'``).
With FlexKV as shipped, every flush therefore fails: the bridge bypasses FlexKV (no old KV served) and
says so. With that table as FlexKV means it (the two entries removed), the flush empties FlexKV.
"""

from __future__ import annotations

from .radix_harness import Rig, read, zero
from .real_flexkv import needs_flexkv
from .test_sglang_bridge import IDS
from .test_sglang_bridge_flexkv_kvmanager import _stored_and_evicted, flexkv  # noqa: F401 (a fixture)

pytestmark = needs_flexkv


def test_a_flush_of_flexkvs_real_kvmanager_empties_it_or_bypasses_it(flexkv, monkeypatch, models, caplog):  # noqa: F811
    _, rigs = flexkv
    rig = Rig(monkeypatch, models["llama"], "mha")  # FlexKV starts here (~20 s)
    rigs.append(rig)
    bridge = rig.cache.flexkv_connector
    rig.finish(rig.request("r1", IDS, prompt=40, seed=7))  # the old weights' KV
    assert _stored_and_evicted(rig) == len(IDS)
    assert bridge.lookup_kv(IDS, [True] * len(IDS))[1] == len(IDS)  # control: FlexKV holds it

    rig.cache.reset()  # Scheduler.flush_cache -> tree_cache.reset(): FlexKV 34ab141's reset_cache raises
    assert bridge.stale and "'int' object has no attribute 'is_completed'" in caplog.text
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert loaded == 0  # bypassed: the old KV is not served

    tasks = bridge.manager.kv_task_engine.tasks  # FlexKV's table as it is meant: tasks only
    for bogus in ("max_age_seconds", "max_len"):
        tasks.pop(bogus)
    rig.cache.reset()
    assert not bridge.stale and bridge.lookup_kv(IDS, [True] * len(IDS))[1] == 0  # emptied
    req = rig.request("r3", IDS, prompt=40, seed=8)  # the new weights' KV
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    assert _stored_and_evicted(rig) == len(IDS)
    zero(rig.pool, req.slots)
    loaded, slots = rig.match_and_load(rig.request("r4", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and read(rig.pool, slots) == expected
