"""A flush (after a weight update) empties FlexKV, or fails as SGLang's own flush does.

SGLang flushes after a weight update (scheduler.py:5518; weight_updater.py:121-132);
``FlexKVRadixCache.reset`` reaches FlexKV's connector ``reset`` (connector.py:1424), which never called
``KVManager.reset`` (kvmanager.py:383-388): the same prompt got the old weights' KV from FlexKV.
"""

from __future__ import annotations

import pytest

from . import flexkv_faults
from . import flexkv_standin as fk
from .flexkv_faults import manager, stored
from .radix_harness import Rig

faulty = flexkv_faults.faulty  # the fixture
IDS = list(range(1000, 1048))


def _hit_after_flush(rig: Rig) -> int:
    stored(rig, "r1", IDS, seed=7)  # the old weights' KV, in FlexKV
    rig.cache.reset()  # Scheduler.flush_cache: tree_cache.reset()
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    return loaded


def test_a_flush_empties_flexkv(faulty, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    assert _hit_after_flush(rig) == 0
    assert manager(rig).resets >= 1 and not manager(rig).pages
    stored(rig, "r3", IDS, seed=8)  # FlexKV serves the new weights' KV as before
    loaded, _ = rig.match_and_load(rig.request("r4", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS)


def test_negative_control_a_kvmanager_reset_that_keeps_the_pages_serves_the_old_kv(faulty, models, monkeypatch):
    faulty.reset = "noop"
    rig = Rig(monkeypatch, models["llama"], "mha")
    assert _hit_after_flush(rig) == len(IDS)


def test_a_failed_reset_bypasses_flexkv_until_a_flush_succeeds(faulty, models, monkeypatch, caplog):
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "r1", IDS, seed=7)
    faulty.reset = "raise"
    rig.cache.reset()  # no scheduler hook in this process: SGLang's flush goes on, FlexKV is bypassed
    assert "did not empty FlexKV" in caplog.text
    lookups = len(fk.calls("get_match"))
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert loaded == 0 and len(fk.calls("get_match")) == lookups  # not even asked: its KV may be stale
    faulty.reset = ""
    rig.cache.reset()
    stored(rig, "r3", IDS, seed=8)
    loaded, _ = rig.match_and_load(rig.request("r4", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS)


def test_a_flush_waits_for_a_load_past_the_deadline_or_fails(faulty, models, monkeypatch, caplog):
    monkeypatch.setenv("FLEXKV_ADAPTER_RESET_WAIT_S", "0.05")
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "r1", IDS, seed=7)
    faulty.get, faulty.delay = "timeout", 10**9  # a copy that does not end
    assert rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))[0] == 0
    rig.cache.reset()
    assert "still copying" in caplog.text and manager(rig).resets == 0  # FlexKV is not reset under a running copy
    assert rig.cache.flexkv_connector.stale
    manager(rig).late = {tid: 1 for tid in manager(rig).late}
    manager(rig).advance(1)  # the copy ends
    rig.cache.reset()
    assert not rig.cache.flexkv_connector.stale and manager(rig).resets == 1


def test_negative_control_without_the_bypass_a_failed_reset_serves_the_old_kv(faulty, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "r1", IDS, seed=7)
    faulty.reset = "raise"
    rig.cache.reset()
    rig.cache.flexkv_connector.stale = False  # the bypass taken away
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS)  # the old weights' KV


def test_negative_control_without_the_wait_flexkv_is_reset_under_a_running_copy(faulty, models, monkeypatch):
    from flexkv_adapter.integrations.sglang import flush as sglang_flush

    monkeypatch.setattr(sglang_flush, "_drain", lambda bridge, wait_s: True)
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "r1", IDS, seed=7)
    faulty.get, faulty.delay = "timeout", 10**9
    assert rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))[0] == 0
    rig.cache.reset()
    assert manager(rig).resets == 1 and manager(rig).late  # reset while FlexKV's copy still writes the slots


def _import_scheduler(monkeypatch):
    """SGLang's real Scheduler class. After the test the scheduler module leaves sys.modules again if it was not
    there (the plugin hooks flush_cache only where it is loaded), flush_cache is SGLang's own and the root
    logger has its handlers back; the modules the import brought stay loaded."""
    import importlib
    import logging
    import sys

    from flexkv_adapter.integrations.sglang.flush import SCHEDULER_MODULE

    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    had = SCHEDULER_MODULE in sys.modules
    module = importlib.import_module(SCHEDULER_MODULE)
    if not had:
        del sys.modules[SCHEDULER_MODULE]
        monkeypatch.setitem(sys.modules, SCHEDULER_MODULE, module)
    monkeypatch.setattr(module.Scheduler, "flush_cache", module.Scheduler.flush_cache)
    return module.Scheduler


@pytest.fixture
def real_scheduler(monkeypatch):
    """Imported before the plugin loads, as in the scheduler process (scheduler.py:6323 loads the plugins): the
    plugin hooks its flush_cache."""
    return _import_scheduler(monkeypatch)


def _idle(rig: Rig, cleared: list[str]):
    """What SGLang's Scheduler.flush_cache (scheduler.py:5518-5547) reads of its scheduler, idle; the pools it
    clears after the tree are named in ``cleared``."""
    from types import SimpleNamespace

    def clear(name):
        return lambda *args, **kwargs: cleared.append(name)

    return SimpleNamespace(
        is_fully_idle=lambda ignore_waiting=False: True, _engine_paused=False, tree_cache=rig.cache,
        req_to_token_pool=SimpleNamespace(clear=clear("req_to_token"), reset_aux_cache_allocator=clear("aux")),
        token_to_kv_pool_allocator=SimpleNamespace(clear=clear("allocator")),
        grammar_manager=SimpleNamespace(clear=clear("grammar")),
        metrics_reporter=SimpleNamespace(reset_metrics=clear("metrics"), is_stats_logging_rank=False),
        draft_worker=None,
    )  # fmt: skip


def test_sglangs_real_flush_cache_fails_before_sglang_resets_when_flexkv_cannot_be_emptied(
    real_scheduler, faulty, models, monkeypatch
):
    from flexkv_adapter.integrations.sglang.flush import FlushError

    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "r1", IDS, seed=7)
    rig.finish(rig.request("r5", list(range(3000, 3048)), prompt=40, seed=9))  # on the device tree
    for _ in range(3):
        rig.cache.check_hicache_events()
    cached = rig.cache.evictable_size()
    faulty.reset = "raise"
    cleared: list[str] = []
    assert real_scheduler.flush_cache(_idle(rig, cleared), empty_cache=False) is False  # as with running requests
    assert rig.cache.evictable_size() == cached and rig.cache.flexkv_connector.stale  # SGLang's tree untouched
    assert cleared == []  # and none of its pools
    with pytest.raises(FlushError, match="KVManager.reset failed"):  # what the hook on flush_cache turns into False
        rig.cache.reset()
    faulty.reset = ""
    assert real_scheduler.flush_cache(_idle(rig, cleared), empty_cache=False) is True
    assert rig.cache.evictable_size() == 0 and not rig.cache.flexkv_connector.stale and not manager(rig).pages
    assert cleared == ["req_to_token", "allocator", "aux", "grammar", "metrics"]


def test_negative_control_unhooked_sglang_reports_a_flush_that_left_flexkv_unemptied(faulty, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    scheduler = _import_scheduler(monkeypatch)  # after the plugin loaded: its flush_cache is not hooked
    stored(rig, "r1", IDS, seed=7)
    faulty.reset = "raise"
    assert scheduler.flush_cache(_idle(rig, []), empty_cache=False) is True  # the weight update reports success
    assert rig.cache.flexkv_connector.stale and manager(rig).pages  # while FlexKV still holds the old KV
