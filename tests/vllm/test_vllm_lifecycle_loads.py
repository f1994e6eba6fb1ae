"""Loads through vLLM's real Scheduler (0.33 or 0.32) and worker driver with the plugin: hits, failed loads
(both ``kv_load_failure_policy`` values, whole and partial), abort during a load, preemption.

FlexKV's connector code is its real ``vllm_v1_adapter.py`` (conftest); its KVManager is the stand-in
in ``fake_flexkv``, whose :data:`flexkv.kvmanager.CONTROL` makes its next transfers fail or linger.
"""

from __future__ import annotations

import pytest

from flexkv_adapter.integrations.vllm.lifecycle import applicable

from .engine import BLOCK, Engine, flexkv_empty

A = list(range(100, 148))  # three blocks, stored in FlexKV by request A
B = [*A, 1, 2, 3, 4, 5, 6, 7, 8]  # shares A's three blocks


@pytest.fixture
def control():
    from flexkv.kvmanager import CONTROL

    saved = dict(CONTROL)
    yield CONTROL
    CONTROL.update(saved)


def unwrap(cls) -> None:
    """Negative control: vLLM's own methods back, as without the lifecycle wrappers."""
    for name in applicable(cls):
        setattr(cls, name, getattr(cls, name).__wrapped__)


def new_schedules(engine: Engine, req_id: str) -> list[int]:
    """num_computed_tokens each time the scheduler (re)admitted the request as new."""
    return [r.num_computed_tokens for so in engine.outputs for r in so.scheduled_new_reqs if r.req_id == req_id]


def stored_a_then_forgot(plugged, tmp_path, policy: str = "fail") -> Engine:
    engine = Engine(plugged, tmp_path, policy=policy)
    engine.serve("A", A)
    engine.forget_local()
    return engine


def test_b_reuses_as_prefix_and_the_loaded_blocks_hold_as_bytes(plugged, tmp_path):
    engine = stored_a_then_forgot(plugged, tmp_path)
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [48]
    assert engine.holds("B", A, 3)  # B's forward wrote block 3 only: blocks 0-2 are FlexKV's copy of A's
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH" and flexkv_empty(engine)


def test_negative_control_a_broken_registration_loads_other_bytes(plugged, tmp_path):
    from flexkv.server.client import REGISTRATIONS

    engine = stored_a_then_forgot(plugged, tmp_path)
    REGISTRATIONS[-1]["kv_caches"].reverse()  # FlexKV now writes layer 0's bytes into layer 2
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert not engine.holds("B", A, 3)


@pytest.mark.parametrize("driver", ["v2", "v1"])
def test_failed_load_with_recompute_recomputes_from_the_first_block(plugged, tmp_path, control, driver):
    engine = Engine(plugged, tmp_path, policy="recompute", driver=driver)
    engine.serve("A", A)
    engine.forget_local()
    control["fail_gets"] = 1
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [0]  # never admitted with the failed tokens counted
    assert engine.holds("B", A, 3)  # recomputed over the 0xEE the failed transfer left
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH" and len(b.output_token_ids) == 2
    assert engine.flexkv.flexkv_stats.num_get_requests == 2  # A's miss, B's hit: the failed hit not offered again
    assert flexkv_empty(engine)


@pytest.mark.parametrize("driver", ["v2", "v1"])
def test_failed_load_with_fail_policy_ends_the_request_with_an_error(plugged, tmp_path, control, driver):
    engine = Engine(plugged, tmp_path, policy="fail", driver=driver)
    engine.serve("A", A)
    engine.forget_local()
    free = engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    control["fail_gets"] = 1
    engine.add("B", B)
    engine.run(engine.idle)
    assert engine.finished["B"].name == "ERROR" and new_schedules(engine, "B") == []
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free
    assert flexkv_empty(engine)


def test_negative_control_without_the_wrappers_a_failed_load_is_served_as_a_hit(plugged, tmp_path, control):
    engine = stored_a_then_forgot(plugged, tmp_path, policy="fail")
    unwrap(plugged)
    control["fail_gets"] = 1
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [48] and not engine.holds("B", A, 1)  # decodes from 0xEE blocks


def test_partial_failure_recomputes_from_the_failed_tasks_first_block(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path, policy="recompute")
    a = engine.add("A", A)
    engine.run(lambda: a.status.name == "RUNNING")
    (blocks_a,) = engine.scheduler.kv_cache_manager.get_block_ids("A")
    engine.run(engine.idle)
    engine.scheduler.kv_cache_manager.evict_blocks(set(blocks_a[1:3]))  # vLLM keeps block 0 only
    control["fail_gets"] = 1
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [BLOCK]  # vLLM's own block 0 stays; FlexKV's blocks 1-2 recomputed
    assert engine.holds("B", A, 3)
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH" and flexkv_empty(engine)


def test_abort_during_a_load_frees_everything_once_flexkv_is_done(plugged, tmp_path, control):
    from vllm.v1.request import RequestStatus

    engine = stored_a_then_forgot(plugged, tmp_path)
    free = engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    control["polls"] = 3
    b = engine.add("B", B)
    engine.run(lambda: engine.flexkv.get_tasks)
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    engine.scheduler.finish_requests("B", RequestStatus.FINISHED_ABORTED)
    assert "B" in engine.scheduler.requests  # FlexKV still writes its blocks: not freed yet
    engine.run(engine.idle)
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free and flexkv_empty(engine)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_abort_while_a_failure_is_being_reported(plugged, tmp_path, control, policy):
    from vllm.v1.request import RequestStatus

    engine = stored_a_then_forgot(plugged, tmp_path, policy=policy)
    control["fail_gets"] = 1
    engine.add("B", B)
    ledger = engine.scheduler.connector._flexkv_adapter_ledger
    engine.run(lambda: ledger.failed)  # FlexKV said FAILED; vLLM is told with the next step
    engine.scheduler.finish_requests("B", RequestStatus.FINISHED_ABORTED)
    engine.run(engine.idle)
    assert not ledger.pending and flexkv_empty(engine)


def test_preemption_and_resume_reload_from_flexkv(plugged, tmp_path):
    engine = stored_a_then_forgot(plugged, tmp_path)
    b = engine.add("B", B, max_tokens=4)
    engine.run(lambda: b.status.name == "RUNNING" and b.num_output_tokens >= 1)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True)  # preempts B
    assert b.num_preemptions == 1 and b.num_computed_tokens == 0
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH" and len(b.output_token_ids) == 4
    assert engine.flexkv.flexkv_stats.num_flexkv_matched_tokens == 2 * 48  # the hit, and again on resume
    assert flexkv_empty(engine)


def test_negative_control_flexkv_alone_cancels_the_reload_of_a_request_preempted_by_a_reset(plugged, tmp_path):
    engine = stored_a_then_forgot(plugged, tmp_path)
    flexkvs = plugged.build_connector_meta.__wrapped__

    def without_the_readmission_guard(self, scheduler_output):
        flexkvs(self, scheduler_output)
        return self._flexkv_adapter_ledger.metadata()

    plugged.build_connector_meta = without_the_readmission_guard
    b = engine.add("B", B, max_tokens=4)
    engine.run(lambda: b.status.name == "RUNNING" and b.num_output_tokens >= 1)
    engine.scheduler.reset_prefix_cache(reset_running_requests=True)
    with pytest.raises(AssertionError, match="not reached"):
        engine.run(engine.idle, steps=10)
    assert b.status.name == "WAITING_FOR_REMOTE_KVS" and not engine.flexkv.req_id_to_task_dict  # task cancelled


@pytest.mark.parametrize(("policy", "expected"), [("recompute", "LENGTH"), ("fail", "ERROR")])
def test_at_tp2_every_worker_reports_the_failure_and_vllm_aggregates_it(plugged, tmp_path, control, policy, expected):
    engine = Engine(plugged, tmp_path, policy=policy, workers=2)
    engine.serve("A", A)
    engine.forget_local()
    control["fail_gets"] = 1
    engine.add("B", B)
    engine.run(engine.idle)
    assert engine.finished["B"].name == expected and new_schedules(engine, "B") == (
        [0] if policy == "recompute" else []
    )
    assert not engine.aggregator._recv_remaining_count and flexkv_empty(engine)


def test_a_failed_store_is_a_future_miss_and_frees_the_blocks(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    pool = engine.scheduler.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()
    control["fail_puts"] = 1
    engine.serve("A", A)
    assert flexkv_empty(engine) and pool.get_num_free_blocks() == free
    engine.forget_local()
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [0]
