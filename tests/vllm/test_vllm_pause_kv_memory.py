"""vLLM 0.34's ``sleep``, ``release_kv_cache_memory`` and ``pause_generation(clear_cache=True)`` with
``reset_connector=False``, run by vLLM's own ``EngineCore`` methods over the real Scheduler with the plugin: FlexKV is
emptied before vLLM frees or releases the KV memory, whatever the caller chose, so no KV from before is served after.

The engine core is vLLM's ``EngineCore`` without its constructor: its scheduler is the tier's real Scheduler, its
executor a stand-in that does what vLLM's GPU worker does with the connector (gpu_worker.py 0.34: 319-378: sleep and
``discard(("kv_cache",))`` call ``unregister_kv_caches``, wake ``restore_kv_caches``). The negative control takes the
plugin's rule out: FlexKV then keeps the KV and serves it after the wake.
"""

from __future__ import annotations

import inspect

import pytest

from flexkv_adapter.integrations.vllm import scheduler_reset

from .engine import Engine, flexkv_empty
from .test_vllm_lifecycle_loads import A, B, control, new_schedules
from .test_vllm_lifecycle_reset import flexkv_blocks

__all__ = ["control"]


@pytest.fixture(autouse=True)
def _needs_the_choice():
    from vllm.v1.engine.core import EngineCore

    if "reset_connector" not in inspect.signature(EngineCore.sleep).parameters:
        pytest.skip("this vLLM's sleep always resets the connector (vLLM 0.34 added reset_connector)")


class Executor:
    """What vLLM's executor and GPU workers do with the KV connector on sleep, discard and wake."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.vllm_config, self.is_sleeping = engine, engine.config, False

    def collective_rpc(self, method: str, *args, **kwargs) -> list:
        return []

    def reset_mm_cache(self) -> None:
        pass

    def reset_encoder_cache(self) -> None:
        pass

    def sleep(self, level: int) -> None:
        self.discard(("kv_cache",))
        self.is_sleeping = True

    def discard(self, tags: tuple[str, ...]) -> None:
        for worker in self.engine.workers:
            worker.unregister_kv_caches()

    def wake(self) -> None:
        for worker in self.engine.workers:
            worker.restore_kv_caches()
        self.is_sleeping = False


def engine_core(engine: Engine):
    from vllm.v1.engine.core import CheckpointState, EngineCore

    core = object.__new__(EngineCore)
    core.scheduler, core.model_executor, core.batch_queue, core.mm_receiver_cache = (
        engine.scheduler,
        Executor(engine),
        None,
        None,
    )
    core._checkpoint_state, core._kv_cache_reclaimable = CheckpointState.RUNNING, False
    core.step_fn, core.post_step = (lambda: (engine.step(), True)), (lambda model_executed: None)
    return core


def stored_then(plugged, tmp_path, how: str):
    """A served and stored in FlexKV; then vLLM's own call ``how`` with reset_connector=False."""
    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    assert flexkv_blocks() == 3
    core = engine_core(engine)
    if how == "sleep":
        core.sleep(level=1, reset_connector=False)
    elif how == "release":
        core.sleep(level=0)  # the completed pause release_kv_cache_memory needs
        core.release_kv_cache_memory(reset_connector=False)
    else:
        core.pause_scheduler(clear_cache=True, reset_connector=False)
    return engine, core


def woken(engine: Engine, core) -> None:
    core.model_executor.wake()
    core.resume_scheduler()


@pytest.mark.parametrize("how", ["sleep", "release", "pause"])
def test_flexkv_is_emptied_whatever_reset_connector_says_and_nothing_from_before_is_served(
    plugged, tmp_path, control, how
):
    from flexkv.server import client

    engine, core = stored_then(plugged, tmp_path, how)
    assert control["resets"] == 1 and flexkv_blocks() == 0 and flexkv_empty(engine)
    assert client.SUSPENDED is (how != "pause")  # FlexKV unmapped the memory vLLM freed or released
    woken(engine, core)
    assert not client.SUSPENDED
    engine.serve("B", B)
    assert new_schedules(engine, "B") == [0]  # cold: neither vLLM nor FlexKV holds A any more


def test_a_plain_reset_of_an_unpaused_engine_keeps_flexkv_as_the_caller_chose(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True) is True
    assert control["resets"] == 0 and flexkv_blocks() == 3
    engine.serve("B", B)
    assert new_schedules(engine, "B") == [48]  # FlexKV's copy: vLLM's memory was never freed


def test_a_flexkv_that_cannot_be_emptied_makes_vllms_call_raise_before_it_frees_memory(
    plugged, tmp_path, control, monkeypatch
):
    from flexkv.server import client

    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    monkeypatch.setattr(type(engine.scheduler.connector._flexkv_connector), "reset_cache", lambda self: False)
    with pytest.raises(RuntimeError, match="Failed to reset the KV connector cache"):
        engine_core(engine).sleep(level=1, reset_connector=False)
    assert flexkv_blocks() == 3 and not client.SUSPENDED  # vLLM stopped before its workers freed anything


@pytest.mark.parametrize("how", ["sleep", "release"])
def test_negative_control_without_the_rule_flexkv_serves_kv_from_before_the_memory_was_freed(
    plugged, tmp_path, control, monkeypatch, how
):
    monkeypatch.setattr(scheduler_reset, "clears_a_paused_engine", lambda scheduler, reset_running_requests: False)
    engine, core = stored_then(plugged, tmp_path, how)
    assert control["resets"] == 0 and flexkv_blocks() == 3
    woken(engine, core)
    engine.serve("B", B)
    assert new_schedules(engine, "B") == [48]  # FlexKV's KV from before the sleep, loaded into the new memory
