"""A flush through FlexKV's REAL KVManager (task engine, radix index, transfer processes; only compiled parts
replaced).

FlexKV 34ab141 pins ``expiring-dict==1.1.2`` (requirements.txt:11) and builds its task table as
``ExpiringDict(max_age_seconds=1800, max_len=100000)`` (kvtask.py:212): 1.1.2's constructor is
``(ttl=None, interval=0.1, *args, **kwargs)``, so the two keywords become two entries holding ints, and
``reset_cache`` (kvtask.py:1446-1489) fails on them (``'int' object has no attribute 'is_completed'``).
The bridge removes them before FlexKV's reset (``flexkv_adapter.flexkv.reset``): with FlexKV as shipped a
flush empties FlexKV. Without that, every flush failed and FlexKV was bypassed for good.
"""

from __future__ import annotations

import logging

from flexkv_adapter.flexkv.reset import CONSTRUCTOR_KEYWORDS
from flexkv_adapter.integrations.sglang import flush as sglang_flush

from .radix_harness import Rig, read, zero
from .real_flexkv import needs_flexkv
from .test_sglang_bridge import IDS
from .test_sglang_bridge_flexkv_kvmanager import _stored_and_evicted, flexkv  # noqa: F401 (a fixture)

pytestmark = needs_flexkv


def test_a_flush_of_flexkvs_real_kvmanager_as_shipped_empties_it(flexkv, monkeypatch, models, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="flexkv_adapter.flexkv.reset")
    _, rigs = flexkv
    rig = Rig(monkeypatch, models["llama"], "mha")  # FlexKV starts here (~20 s)
    rigs.append(rig)
    bridge = rig.cache.flexkv_connector
    tasks = bridge.manager.kv_task_engine.tasks  # FlexKV's table as 34ab141 builds it with expiring-dict 1.1.2
    assert {key: tasks[key] for key in CONSTRUCTOR_KEYWORDS} == {"max_age_seconds": 1800, "max_len": 100000}
    rig.finish(rig.request("r1", IDS, prompt=40, seed=7))  # the old weights' KV
    assert _stored_and_evicted(rig) == len(IDS)
    assert bridge.lookup_kv(IDS, [True] * len(IDS))[1] == len(IDS)  # control: FlexKV holds it

    with monkeypatch.context() as broken:  # negative control: FlexKV's reset on its table as shipped
        broken.setattr(sglang_flush, "repair_task_table", lambda manager: [])
        rig.cache.reset()  # Scheduler.flush_cache -> tree_cache.reset(): FlexKV 34ab141's reset_cache raises
    assert bridge.stale and "'int' object has no attribute 'is_completed'" in caplog.text
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert loaded == 0  # bypassed: the old KV is not served

    rig.cache.reset()  # the bridge's flush: the table repaired, then FlexKV's own reset
    assert not bridge.stale and bridge.lookup_kv(IDS, [True] * len(IDS))[1] == 0  # emptied
    assert "removed max_age_seconds, max_len from FlexKV's task table" in caplog.text
    assert not any(key in tasks for key in CONSTRUCTOR_KEYWORDS)
    req = rig.request("r3", IDS, prompt=40, seed=8)  # the new weights' KV
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    assert _stored_and_evicted(rig) == len(IDS)
    zero(rig.pool, req.slots)
    loaded, slots = rig.match_and_load(rig.request("r4", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and read(rig.pool, slots) == expected
    rig.cache.reset()  # a second flush: nothing to repair, FlexKV emptied again
    assert not bridge.stale and bridge.lookup_kv(IDS, [True] * len(IDS))[1] == 0
