"""vLLM's ``Scheduler.reset_prefix_cache`` with FlexKV's connector: FlexKV's transfers settled first, then both
caches reset or neither. The one patch of vLLM's Scheduler, listed in :data:`.lifecycle.PATCHES`.

FlexKV's ``request_finished`` keeps a stored request's blocks until a later poll reports the store done
(adp:505-558, asked at sched:3395), and vLLM frees them only when a step's output reports it in
``finished_sending`` (sched:3579-3582). vLLM's reset empties its own cache first, raises with
``reset_running_requests`` when a block is still held (sched:3212-3219), and resets the connector after
(sched:3221-3222), even when its own reset failed. So right after a stored request finished,
``reset_prefix_cache(reset_running_requests=True, reset_connector=True)``, which ``pause_generation(clear_cache=True)``
and ``sleep()`` run (engine/core.py:932-944), raised before FlexKV was reached; with ``reset_connector=True``
alone it answered False with FlexKV reset. The plugin's drain inside the connector's reset came too late:
vLLM's own reset had already failed, and only an output frees the blocks.

For a scheduler whose connector is the plugin's FlexKV connector, every reset first finishes FlexKV's
transfers (bounded by ``reset_wait_s``) and hands their outcomes to vLLM as a step's output would
(``_update_from_kv_xfer_finished``), so a stored request's blocks come back. A reset with the connector then
preempts the running requests where asked (as sched:3194-3210 does), resets FlexKV only where vLLM's own
reset will succeed (every block free: block_pool.py:881), and vLLM's cache only where FlexKV's reset did:
True with both emptied, or False with neither touched. A block still held after that (a request waiting for
its load: vLLM's own limit) leaves the answer to vLLM (False, or its RuntimeError), FlexKV untouched.

vLLM 0.34 lets ``sleep``, ``release_kv_cache_memory`` and ``pause_generation(clear_cache=True)`` keep the
connector's cache (``reset_connector=False``; engine/core.py 0.34: 981-995, 1050-1059, 1174-1192): vLLM then frees
or releases the KV memory FlexKV copied from, and FlexKV would serve that KV after the wake, also across a weight
update it cannot see. Every reset of a paused engine's whole cache (:func:`clears_a_paused_engine`: what those calls
run) therefore empties FlexKV too, whatever ``reset_connector`` says, with a warning; if FlexKV cannot be emptied the
reset answers False and vLLM raises at the call ("Failed to reset the KV connector cache"), before it frees memory.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import time
from typing import Any

from ...errors import AdapterError
from .lifecycle import LEDGER, RESET_WAIT, drain

logger = logging.getLogger(__name__)

NAME = "Scheduler.reset_prefix_cache"  # its entry in lifecycle.PATCHES
_MODULE = "vllm.v1.core.sched.scheduler"
MARK = "_flexkv_adapter_reset_patched"  # on vLLM's Scheduler once patched
# What the patch calls on vLLM's Scheduler, with the parameters vLLM 0.32, 0.33 and 0.34 declare
CALLS: dict[str, tuple[str, ...]] = {
    "reset_prefix_cache": ("self", "reset_running_requests", "reset_connector"),
    "reset_connector_cache": ("self",),
    "_update_from_kv_xfer_finished": ("self", "kv_connector_output"),
    "_preempt_request": ("self", "request", "timestamp", "drop_stale_output"),
}


def scheduler_mismatch(cls: Any) -> str | None:
    """Why vLLM's Scheduler is not one the patch was proven on (a method it calls differs), or None."""
    for name, params in CALLS.items():
        fn = getattr(cls, name, None)
        got = tuple(inspect.signature(fn).parameters) if fn is not None else "missing"
        if got != params:
            return f"vLLM's Scheduler.{name} is {got}, not {params}"
    return None


def install() -> None:
    """Patch vLLM's Scheduler (idempotent); a Scheduler that differs refuses the connector with the reason.

    Called where the scheduler-side connector is constructed: vLLM's Scheduler is imported there already.
    """
    cls = importlib.import_module(_MODULE).Scheduler
    if cls.__dict__.get(MARK):
        return
    mismatch = scheduler_mismatch(cls)
    if mismatch:
        raise AdapterError(
            f"flexkv_adapter: {mismatch}; without the patch a reset right after a request finished fails, so the "
            f"plugin refuses"
        )
    cls.reset_prefix_cache = functools.wraps(cls.reset_prefix_cache)(_wrap(cls.reset_prefix_cache))
    setattr(cls, MARK, True)


def _wrap(original: Any) -> Any:
    def reset_prefix_cache(self: Any, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        ledger = getattr(self.connector, LEDGER, None)
        if ledger is None:  # no connector, another connector, or FlexKV's worker side: vLLM's own reset
            return original(self, reset_running_requests, reset_connector)  # type: ignore[no-any-return]
        if not reset_connector and clears_a_paused_engine(self, reset_running_requests):
            logger.warning(
                "flexkv_adapter: vLLM clears a paused engine's KV cache (sleep, release_kv_cache_memory or "
                "pause_generation(clear_cache=True)) with reset_connector=False; FlexKV is emptied too, as it "
                "cannot tell whether the weights change before the engine runs again"
            )
            reset_connector = True
        settled = settle(self, ledger)
        if not reset_connector:
            return original(self, reset_running_requests, False)  # type: ignore[no-any-return]
        if not settled:
            logger.error(
                "flexkv_adapter: FlexKV transfers still in flight after %.0f s; neither vLLM's prefix cache nor "
                "FlexKV's was reset",
                getattr(self.connector, RESET_WAIT),
            )
            return False
        if reset_running_requests:
            preempt_running(self)
        pool = self.kv_cache_manager.block_pool
        if pool.num_gpu_blocks - pool.get_num_free_blocks() != 1:  # vLLM's reset would fail (block_pool.py:881)
            return original(self, reset_running_requests, False)  # type: ignore[no-any-return]
        if not self.reset_connector_cache():  # FlexKV's reset failed: vLLM's cache is left as it is
            return False
        return original(self, reset_running_requests, False)  # type: ignore[no-any-return]

    return reset_prefix_cache


def clears_a_paused_engine(scheduler: Any, reset_running_requests: bool) -> bool:
    """Whether a reset is ``EngineCore._reset_caches`` of a paused engine: every running request reset while vLLM's
    scheduler is paused (``pause_state``), as before vLLM frees or releases the KV memory, or lends it out."""
    state = getattr(scheduler, "pause_state", None)
    return bool(reset_running_requests) and state is not None and getattr(state, "name", "UNPAUSED") != "UNPAUSED"


def settle(scheduler: Any, ledger: Any) -> bool:
    """Finish FlexKV's transfers and tell vLLM, as a step's output would; False if some outlived ``reset_wait_s``.

    ``update_connector_output`` (the plugin's, called by ``_update_from_kv_xfer_finished``) polls FlexKV and
    merges what finished; vLLM then frees the blocks of requests whose store finished (sched:3579-3582) and
    marks finished loads for the next schedule. A failed load stays held back for the workers' next report.
    """
    output = importlib.import_module("vllm.v1.outputs").KVConnectorOutput()  # an empty one: what FlexKV adds
    done = drain(scheduler.connector, ledger)
    scheduler._update_from_kv_xfer_finished(output)
    return done


def preempt_running(scheduler: Any) -> None:
    """vLLM's own preemption of every running request (sched:3194-3210), done before FlexKV's reset: only then
    can it be known whether vLLM's reset will succeed. 0.32 and 0.33 then forget the previous step's scheduled
    ids (the V1 runner's persistent batch); 0.34, without that runner, has no such set (sched 0.34: 3338-3342)."""
    timestamp = time.monotonic()
    while scheduler.running:
        scheduler._preempt_request(scheduler.running.pop(), timestamp, drop_stale_output=True)
    previous = getattr(scheduler, "prev_step_scheduled_req_ids", None)
    if previous is not None:
        previous.clear()


__all__ = [
    "CALLS",
    "MARK",
    "NAME",
    "clears_a_paused_engine",
    "install",
    "preempt_running",
    "scheduler_mismatch",
    "settle",
]
