"""A reset right after a request finished, through vLLM's real Scheduler (0.32 or 0.33) and worker driver with the
plugin (FlexKV: the stand-in in ``fake_flexkv``, following 34ab141).

FlexKV's ``request_finished`` keeps a stored request's blocks until a later poll (adp:505-558); vLLM resets
its own cache first and raises, or answers False after resetting FlexKV anyway (sched:3212-3222). That is the
state ``generate()`` leaves, and the reset ``pause_generation(clear_cache=True)`` and ``sleep()`` run. With
the plugin's patch of ``Scheduler.reset_prefix_cache`` the reset answers True with both caches emptied, or
False with neither touched (docs/vllm.md); the negative controls take the patch out.
"""

from __future__ import annotations

import types

import pytest

from flexkv_adapter.integrations.vllm import lifecycle as vllm_lifecycle
from flexkv_adapter.integrations.vllm import scheduler_reset

from .engine import Engine, flexkv_empty
from .test_vllm_lifecycle_loads import A, B, control, new_schedules, stored_a_then_forgot

__all__ = ["control"]  # the fixture, shared

C = list(range(600, 648))  # shares nothing with A


def scheduler_cls():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def unpatch_scheduler() -> None:
    """Negative control: vLLM's own reset_prefix_cache back (the connector wrappers stay; conftest restores)."""
    scheduler_cls().reset_prefix_cache = scheduler_cls().reset_prefix_cache.__wrapped__


def finished_with_its_store_pending(engine: Engine, req_id: str = "A") -> None:
    """Step until the request finished, and no further: what vLLM's ``generate()`` returns on."""
    engine.run(lambda: req_id in engine.finished)
    assert req_id in engine.scheduler.requests and engine.flexkv.tasks_to_launch  # FlexKV keeps its blocks


def vllm_cached(engine: Engine) -> int:
    """Blocks vLLM's own prefix cache can hit."""
    return len(engine.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block)


def all_free(engine: Engine) -> bool:
    pool = engine.scheduler.kv_cache_manager.block_pool
    return bool(pool.get_num_free_blocks() == pool.num_gpu_blocks - 1)


def flexkv_blocks() -> int:
    """Blocks FlexKV's CPU cache holds (the stand-in's KVManager)."""
    from flexkv.kvmanager import MANAGERS

    return len(MANAGERS[-1].cache)


@pytest.mark.parametrize("running", [True, False])
def test_a_reset_right_after_a_stored_request_finished_empties_vllm_and_flexkv(plugged, tmp_path, control, running):
    engine = Engine(plugged, tmp_path)
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=running, reset_connector=True) is True
    assert control["resets"] == 1 and vllm_cached(engine) == 0 and all_free(engine)
    assert flexkv_empty(engine) and flexkv_blocks() == 0
    engine.serve("A2", A)
    assert new_schedules(engine, "A2") == [0]  # cold: neither vLLM nor FlexKV holds A


def test_vllms_pause_and_sleep_clear_the_caches_right_after_a_request_finished(plugged, tmp_path, control):
    """vLLM's own ``EngineCore._reset_caches``, which ``pause_generation(clear_cache=True)`` and ``sleep()`` run."""
    from vllm.v1.engine.core import EngineCore

    engine = Engine(plugged, tmp_path)
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    noop = lambda: None  # noqa: E731
    core = types.SimpleNamespace(
        reset_prefix_cache=engine.scheduler.reset_prefix_cache, reset_mm_cache=noop, reset_encoder_cache=noop
    )
    EngineCore._reset_caches(core)
    assert control["resets"] == 1 and vllm_cached(engine) == 0 and flexkv_empty(engine) and flexkv_blocks() == 0


def test_a_reset_of_running_requests_preempts_them_and_they_still_finish(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    c = engine.add("C", C, max_tokens=8)
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    assert c.status.name == "RUNNING"
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True, reset_connector=True) is True
    assert c.num_preemptions == 1 and c.num_computed_tokens == 0
    assert control["resets"] == 1 and vllm_cached(engine) == 0 and all_free(engine)
    engine.run(engine.idle)
    assert engine.finished["C"].name == "LENGTH" and len(c.output_token_ids) == 8 and flexkv_empty(engine)
    assert engine.flexkv.flexkv_stats.num_flexkv_matched_tokens == 0  # re-admitted cold: FlexKV was emptied


def test_a_reset_vllm_cannot_do_for_a_running_request_leaves_flexkv_untouched(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    engine.add("C", C, max_tokens=8)
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    cached = vllm_cached(engine)
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is False  # C holds its blocks
    assert control["resets"] == 0 and vllm_cached(engine) == cached and flexkv_blocks() == 3  # A's store done


@pytest.mark.parametrize("running", [True, False])
@pytest.mark.parametrize("failure", ["flexkv_reset", "wait"])
def test_a_failed_flexkv_reset_right_after_a_request_finished_touches_neither_cache(
    plugged, tmp_path, control, monkeypatch, running, failure
):
    engine = Engine(plugged, tmp_path)
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    cached = vllm_cached(engine)
    if failure == "flexkv_reset":  # FlexKV's own reset raises (as in its server-client mode)
        control["fail_reset"] = True
    else:  # the store outlives reset_wait_s
        control["polls"] = 10**6
        monkeypatch.setattr(engine.scheduler.connector, vllm_lifecycle.RESET_WAIT, 0.02)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=running, reset_connector=True) is False
    assert control["resets"] == 0 and vllm_cached(engine) == cached
    control.update(fail_reset=False, polls=1)
    engine.run(engine.idle)
    assert vllm_cached(engine) == cached and flexkv_blocks() == 3 and flexkv_empty(engine)  # A in both


def test_a_reset_while_a_request_waits_for_its_load_is_vllms_own_failure_and_leaves_flexkv_untouched(
    plugged, tmp_path, control
):
    engine = stored_a_then_forgot(plugged, tmp_path)
    control["polls"] = 4
    b = engine.add("B", B)
    engine.run(lambda: engine.flexkv.get_tasks)
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is False  # the load finished; B holds it
    with pytest.raises(RuntimeError, match="waiting for remote KV transfer"):
        engine.scheduler.reset_prefix_cache(reset_running_requests=True, reset_connector=True)
    assert control["resets"] == 0 and flexkv_blocks() == 3
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [48] and engine.holds("B", A, 3)


def test_a_reset_without_the_connector_right_after_a_store_keeps_flexkvs_copy(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True) is True
    assert vllm_cached(engine) == 0 and control["resets"] == 0 and flexkv_blocks() == 3
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [48] and engine.holds("B", A, 3)  # FlexKV's copy of A


def test_negative_control_without_the_scheduler_patch_the_reset_raises_then_answers_false_after_resetting_flexkv(
    plugged, tmp_path, control, monkeypatch
):
    engine = Engine(plugged, tmp_path)
    unpatch_scheduler()
    engine.add("A", A)
    finished_with_its_store_pending(engine)
    with pytest.raises(RuntimeError, match="Failed to reset KV cache"):
        engine.scheduler.reset_prefix_cache(reset_running_requests=True, reset_connector=True)
    assert control["resets"] == 0
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is False
    assert control["resets"] == 1 and vllm_cached(engine) > 0  # "False", yet FlexKV was reset and vLLM was not


def test_negative_control_without_the_scheduler_patch_a_failed_flexkv_reset_still_empties_vllm(
    plugged, tmp_path, control, monkeypatch
):
    engine = Engine(plugged, tmp_path)
    unpatch_scheduler()
    engine.serve("A", A)
    control["fail_reset"] = True
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is False
    assert vllm_cached(engine) == 0 and flexkv_blocks() == 3  # "False", yet vLLM's cache was emptied


def test_the_scheduler_patch_is_listed_and_installed_by_the_scheduler_side(plugged, tmp_path):
    params, vllm_lines, flexkv_lines = vllm_lifecycle.PATCHES[scheduler_reset.NAME]
    assert params == scheduler_reset.CALLS["reset_prefix_cache"]
    assert "sched:3212-3219" in vllm_lines and "adp:505-558" in flexkv_lines
    assert scheduler_reset.NAME not in vllm_lifecycle.applicable(plugged)  # not a connector method
    assert not hasattr(scheduler_cls().reset_prefix_cache, "__wrapped__")
    Engine(plugged, tmp_path)
    assert hasattr(scheduler_cls().reset_prefix_cache, "__wrapped__")


def test_a_vllm_scheduler_that_differs_is_refused_at_construction(plugged, tmp_path, monkeypatch):
    from flexkv_adapter import AdapterError

    monkeypatch.setattr(scheduler_cls(), "_update_from_kv_xfer_finished", lambda self, output, extra: None)
    with pytest.raises(AdapterError, match="_update_from_kv_xfer_finished"):
        Engine(plugged, tmp_path)
