"""Nothing FlexKV raises reaches SGLang's scheduler: the slots and locks are released, FlexKV's task cancelled, a miss.

A load: FlexKV's ``retrieve_kv`` re-raises a launch error (a closed transfer pipe, connector.py:644-655) and
SGLang 0.5.23 has no cleanup for it (flexkv_radix_cache.py:335-348): 48 slots leaked and FlexKV's get task
stayed. A store: FlexKV raises "store launch failed" and never cancels its put task (connector.py:1108-1140),
whose unready pages shadow every later store of the prefix (kvtask.py:740-748). A store poll: FlexKV's
``check_completed_stores`` raising after it took completed stores off its table left their nodes locked.
"""

from __future__ import annotations

import logging

import pytest

from . import flexkv_faults
from . import flexkv_standin as fk
from .flexkv_faults import manager, stored
from .radix_harness import Rig, read

faulty = flexkv_faults.faulty  # the fixture
IDS = list(range(1000, 1048))


def _failures(caplog) -> list[str]:
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("flexkv_adapter")]
    return [m for m in messages if "failed" in m]


def test_a_load_whose_launch_raises_is_a_miss_that_frees_its_slots_and_cancels_the_task(
    faulty, models, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="flexkv_adapter")
    rig = Rig(monkeypatch, models["llama"], "mha")
    expected = stored(rig, "r1", IDS, seed=7)
    free = rig.alloc.available_size()
    faulty.get = "raise"
    loaded, slots = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))  # raised before the fix
    assert (loaded, slots) == (0, None) and rig.alloc.available_size() == free
    (raised,) = fk.calls("launch raised")
    assert manager(rig).tasks[raised["task_ids"][0]].status == "cancelled"  # FlexKV's match is given back
    (logged,) = _failures(caplog)  # once, with FlexKV's error
    assert "FlexKV's load for 'r2@attempt0' failed" in logged and "BrokenPipeError" in logged, logged
    faulty.get = ""
    loaded, slots = rig.match_and_load(rig.request("r3", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and read(rig.pool, slots) == expected


def test_negative_control_a_load_launch_error_passed_through_reaches_sglang_and_leaks_its_slots(
    faulty, models, monkeypatch
):
    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector
    from flexkv_adapter.integrations.sglang.resolve import handle_key

    def passed_through(self, handle, slot_mapping):  # FlexKV's retrieve_kv as SGLang's own connector calls it
        return self.connector.retrieve_kv(handle_key(handle), slot_mapping)

    monkeypatch.setattr(BridgeConnector, "retrieve_kv", passed_through)
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "r1", IDS, seed=7)
    free = rig.alloc.available_size()
    faulty.get = "raise"
    with pytest.raises(BrokenPipeError):  # into SGLang's scheduler
        rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    (raised,) = fk.calls("launch raised")
    assert rig.alloc.available_size() < free  # SGLang has no cleanup for it: the slots leak
    assert manager(rig).tasks[raised["task_ids"][0]].status != "cancelled"  # and FlexKV's get task stays


def _store_fails_then_again(rig: Rig, faults) -> int:
    faults.put = "raise"
    rig.finish(rig.request("r1", IDS, prompt=40, seed=7))  # raised out of checkpoint before the fix
    assert rig.cache.protected_size() == 0 and not rig.cache._inflight_store_nodes  # the node is unlocked
    faults.put = ""
    stored(rig, "r2", IDS, seed=8)  # the same prefix, stored again
    loaded, _ = rig.match_and_load(rig.request("r3", IDS, prompt=40, allocate=False))
    return loaded


def test_a_store_whose_launch_raises_unlocks_and_cancels_its_put_task(faulty, models, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="flexkv_adapter")
    rig = Rig(monkeypatch, models["llama"], "mha")
    assert _store_fails_then_again(rig, faulty) == len(IDS)  # the next store offloaded the prefix
    (logged,) = _failures(caplog)  # once, with FlexKV's error
    assert "FlexKV's store for 'r1@attempt0' failed" in logged and "store launch failed" in logged, logged


def test_negative_control_an_uncancelled_put_task_shadows_the_prefix_forever(faulty, models, monkeypatch):
    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector

    monkeypatch.setattr(BridgeConnector, "_cancel", lambda self, task_ids: None)
    rig = Rig(monkeypatch, models["llama"], "mha")
    assert _store_fails_then_again(rig, faulty) == 0


def _poll_raises_after_taking_stores(rig: Rig, monkeypatch, caplog) -> tuple[int, list[str]]:
    """FlexKV's store poll raises after it took the completed stores off its table (its completion log, run
    after the pop, connector.py:1224-1241): the nodes SGLang locked for them, and what a later request loads."""
    import logging

    conn = rig.cache.flexkv_connector.connector
    log = type(conn)._log_cache_op

    def raising(self, context, action, status, **fields):
        if action == "complete" and fields.get("direction") == "D2H":
            raise RuntimeError("completion log failed")
        return log(self, context, action, status, **fields)

    monkeypatch.setattr(type(conn), "_log_cache_op", raising)
    caplog.set_level(logging.WARNING, logger="flexkv_adapter")
    for i, seed in enumerate((7, 8)):
        rig.finish(rig.request(f"s{i}", [*IDS[:32], *range(2000 + 16 * i, 2016 + 16 * i)], prompt=40, seed=seed))
    for _ in range(3):
        rig.cache.check_hicache_events()  # raised into SGLang's scheduler before the fix
    locked = rig.cache.protected_size()
    monkeypatch.setattr(type(conn), "_log_cache_op", log)
    rig.evict_all()
    loaded, _ = rig.match_and_load(rig.request("r3", [*IDS[:32], *range(2000, 2016)], prompt=40, allocate=False))
    return locked + 1000 * loaded, [r.getMessage() for r in caplog.records if "store-completion poll" in r.getMessage()]


def test_a_raising_store_poll_reports_the_stores_it_took_and_logs_once(faulty, models, monkeypatch, caplog):
    rig = Rig(monkeypatch, models["llama"], "mha")
    outcome, warnings = _poll_raises_after_taking_stores(rig, monkeypatch, caplog)
    assert outcome == 1000 * len(IDS)  # no node left locked, and FlexKV holds the stored prefix
    assert len(warnings) == 1 and "RuntimeError: completion log failed" in warnings[0]


def test_negative_control_stores_a_raising_poll_took_stay_locked(faulty, models, monkeypatch, caplog):
    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector

    monkeypatch.setattr(BridgeConnector, "_poll_failed", lambda self, error: [])
    rig = Rig(monkeypatch, models["llama"], "mha")
    locked = _poll_raises_after_taking_stores(rig, monkeypatch, caplog)[0] % 1000
    assert locked > 0  # FlexKV forgot the stores and SGLang never hears of them: their nodes stay locked
