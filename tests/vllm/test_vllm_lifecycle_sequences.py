"""Random sequences through vLLM's real Scheduler (0.32 or 0.33) and worker driver with the plugin: requests
sharing prefixes, failing FlexKV gets and puts, aborts, resets, steps. After every step each running
request's computed blocks must hold its own KV (never a failed load's bytes); at the end every
request finishes, every block is back in vLLM's pool and FlexKV and the ledger hold nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .engine import BLOCK, Engine, flexkv_empty
from .test_vllm_lifecycle_loads import control

__all__ = ["control"]

PREFIXES = [list(range(100, 148)), list(range(100, 132)) + list(range(300, 316)), list(range(500, 532))]

OPS = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 20), st.integers(1, 3)),
    st.tuples(st.just("fail_gets"), st.integers(1, 2)),
    st.tuples(st.just("fail_puts"), st.integers(1, 2)),
    st.tuples(st.just("abort"), st.integers(0, 9)),
    st.tuples(st.just("abort_mid"), st.integers(0, 9)),
    st.tuples(st.just("reset"), st.booleans()),
    st.tuples(st.just("step"), st.integers(1, 3)),
)


def check_running(engine: Engine) -> None:
    for req_id, request in engine.scheduler.requests.items():
        if request.status.name == "RUNNING":
            done = request.num_computed_tokens - request.num_output_placeholders
            full = min(done, request.num_prompt_tokens) // BLOCK  # prompt blocks: FlexKV's or the model's
            assert engine.holds(req_id, request.all_token_ids, full), f"{req_id} runs on KV it never computed"


class Loop:
    """vLLM's engine loop: schedule, run the workers, process aborts, update_from_output (core.py:667-697).
    Pipelined (the batch queue of async scheduling, core.py:708-800): the update lags one schedule."""

    def __init__(self, engine: Engine, pipelined: bool) -> None:
        self.engine, self.pipelined, self.pending = engine, pipelined, None

    def step(self, aborts=()) -> None:
        engine = self.engine
        so = engine.scheduler.schedule()
        outs = [
            engine._run_worker(w, d, so, forward=i == 0) for i, (w, d) in enumerate(zip(engine.workers, engine.drivers))
        ]
        out = engine.aggregator.aggregate(outs) if len(outs) > 1 else outs[0]
        for req_id in aborts:
            engine.scheduler.finish_requests(req_id, _aborted())
        if self.pipelined:
            self.pending, (so, out) = (so, out), self.pending or (None, None)
        if so is not None:
            engine.scheduler.update_from_output(so, out)
        check_running(engine)


def play(engine: Engine, control, ops, pipelined: bool = False) -> None:
    loop = Loop(engine, pipelined)
    added = []
    for n, op in enumerate(ops):
        if op[0] == "add":
            tokens = PREFIXES[op[1]] + list(range(900 + n * 30, 900 + n * 30 + op[2]))
            added.append(engine.add(f"R{n}", tokens, max_tokens=op[3]).request_id)
        elif op[0] in ("fail_gets", "fail_puts"):
            control[op[0]] += op[1]
        elif op[0] == "abort" and added:
            engine.scheduler.finish_requests(added[op[1] % len(added)], _aborted())
        elif op[0] == "reset":
            resets, done = control["resets"], None
            try:
                done = engine.scheduler.reset_prefix_cache(reset_running_requests=op[1], reset_connector=True)
            except RuntimeError as exc:  # vLLM's own limit (sched:3213): a request still holds loaded blocks
                assert "waiting for remote KV transfer" in str(exc)
            assert control["resets"] - resets == int(bool(done)), "FlexKV reset, yet the reset said otherwise"
            assert not done or not len(engine.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block)
        elif op[0] == "abort_mid" and added:
            loop.step(aborts=[added[op[1] % len(added)]])
        elif op[0] == "step":
            for _ in range(op[1]):
                loop.step()
    for _ in range(60):
        if engine.idle() and loop.pending is None:
            break
        loop.step()
        if engine.idle() and loop.pending is not None:
            loop.step()
    assert engine.idle(), {r: q.status.name for r, q in engine.scheduler.requests.items()}
    pool = engine.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert flexkv_empty(engine)


def _aborted():
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


MODES = {"sync": {}, "tp2": {"workers": 2}, "pipelined": {"pipelined": True}, "sync_get": {"sync_get": True}}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("policy", ["recompute", "fail"])
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(ops=st.lists(OPS, min_size=3, max_size=14))
def test_random_sequences_never_run_on_unloaded_kv_and_leave_nothing_behind(
    plugged, tmp_path, control, policy, mode, ops, monkeypatch
):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    pipelined = MODES[mode].get("pipelined", False)
    if MODES[mode].get("sync_get"):
        monkeypatch.setenv("FLEXKV_SYNC_GET", "1")
    engine = Engine(
        plugged,
        tmp_path,
        policy=policy,
        workers=MODES[mode].get("workers", 1),
        scheduler_cls=AsyncScheduler if pipelined else None,
    )
    engine.serve("seed", PREFIXES[0])
    control.update(fail_gets=0, fail_puts=0)
    try:
        play(engine, control, ops, pipelined)
    finally:
        control.update(fail_gets=0, fail_puts=0)


def test_negative_control_without_the_wrappers_a_failed_load_is_run_on(plugged, tmp_path, control):
    from .test_vllm_lifecycle_loads import unwrap

    engine = Engine(plugged, tmp_path, policy="recompute")
    unwrap(plugged)
    engine.serve("seed", PREFIXES[0])
    engine.scheduler.reset_prefix_cache()
    with pytest.raises(AssertionError, match="runs on KV it never computed"):
        play(engine, control, [("fail_gets", 1), ("add", 0, 5, 2), ("step", 3)])
