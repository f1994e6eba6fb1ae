"""A flush empties FlexKV too, or reports failure as SGLang's own flush does; and the radix hooks the bridge needs.

SGLang flushes after a weight update (scheduler.py:5518; weight_updater.py:121-132, "Flush the cache the
old weights produced"). ``FlexKVRadixCache.reset`` passes that to FlexKV's connector, whose ``reset``
(connector.py:1424) drops its bookkeeping but never calls ``KVManager.reset`` (kvmanager.py:383-388, "Call
after a weight update"): the old weights' KV was served after the flush. :func:`flush` ends the loads
FlexKV may still write (quarantined), resets FlexKV's connector, then ``KVManager.reset``, and agrees
on the result across TP ranks. On failure FlexKV is bypassed (no lookup, no store) until a flush
succeeds, and :class:`FlushError` makes SGLang's ``flush_cache`` return False, as it does when
requests are still running: nothing of SGLang's was reset yet (the hook on ``FlexKVRadixCache.reset``
runs :func:`flush` first).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ...errors import AdapterError
from ...flexkv.reset import repair_task_table

logger = logging.getLogger(__name__)

RADIX_CLASS = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache.FlexKVRadixCache"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
FLUSH_CACHE = f"{SCHEDULER_MODULE}.Scheduler.flush_cache"
PREFIX = "flexkv_adapter (SGLang plugin)"  # every message of the SGLang plugin starts with it


class FlushError(AdapterError):
    """FlexKV could not be emptied: the flush must be reported as failed."""


def _drain(bridge: Any, wait_s: float) -> bool:
    """Poll the quarantined loads until they end; every rank stops at the same poll (agreed)."""
    deadline = time.monotonic() + wait_s
    while len(bridge.quarantine):
        bridge.quarantine.poll(bridge.manager, bridge.leader)
        if not len(bridge.quarantine):
            break
        if not bridge.agreement.min([int(time.monotonic() < deadline)])[0]:
            return False
        time.sleep(0.005)
    return True


def flush(bridge: Any, wait_s: float, report: bool) -> None:
    """Empty FlexKV for ``bridge`` (a BridgeConnector); on failure bypass FlexKV and, if ``report``, raise."""
    problem = ""
    if not _drain(bridge, wait_s):
        problem = f"{len(bridge.quarantine)} load(s) past FlexKV's deadline still copying after {wait_s:.0f} s"
    if not problem:
        try:
            bridge.connector.reset()  # pending lookups cancelled, stores drained (FlexKV raises if not)
        except Exception as exc:
            problem = f"FlexKV's connector reset failed: {type(exc).__name__}: {exc}"
    local = 0 if problem else 1
    if not problem and bridge.leader:
        reset = getattr(bridge.manager, "reset", None)
        try:
            if reset is None:
                raise AttributeError("this FlexKV's KVManager has no reset()")
            repair_task_table(bridge.manager)  # FlexKV 34ab141 as shipped fails every reset without it
            reset()  # the whole prefix tree, every tier
        except Exception as exc:
            problem, local = f"FlexKV's KVManager.reset failed: {type(exc).__name__}: {exc}", 0
    if bridge.agreement.min([local])[0]:
        bridge.stale = False
        bridge.stores.clear()
        return
    bridge.stale = True
    message = (
        f"{PREFIX}: the flush did not empty FlexKV ({problem or 'another TP rank failed'}); FlexKV is bypassed "
        f"(no lookups, no stores) until a flush succeeds"
    )
    logger.error(message)
    if report:
        raise FlushError(message)


# --- hooks (registered by register_radix_hooks) --------------------------------------------------------------


def after_init(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """FlexKVRadixCache.__init__: the bridge learns its radix cache (allocator, in-flight store locks)."""
    attach = getattr(getattr(self, "flexkv_connector", None), "attach", None)
    if attach is not None:
        attach(self)


def init_load_back(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """SGLang frees a load's slots when it got 0; slots FlexKV may still write stay quarantined instead. What the
    load restored is counted for the hits line (:mod:`.hits_log`)."""
    connector = getattr(self, "flexkv_connector", None)
    quarantine = getattr(connector, "quarantine", None)
    if quarantine is None:
        result = original(self, *args, **kwargs)
    else:
        with quarantine.withholding(self.token_to_kv_pool_allocator):
            result = original(self, *args, **kwargs)
    hits = getattr(connector, "hits_log", None)
    if hits is not None:
        params = args[0] if args else kwargs.get("params")
        hits.load(int(getattr(params, "host_hit_length", 0)), int(result[0]))
    return result


def reset(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """FlexKV first: a failed flush raises before SGLang's tree, markers and locks are touched."""
    flush_first = getattr(getattr(self, "flexkv_connector", None), "flush", None)
    if flush_first is not None:
        flush_first()
    return original(self, *args, **kwargs)


def flush_cache(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """Scheduler.flush_cache: a FlexKV that could not be emptied fails the flush (False), as pending requests do."""
    try:
        return original(self, *args, **kwargs)
    except FlushError:
        return False


def register_radix_hooks(registry: Any, hook_type: Any, scheduler_loaded: bool) -> list[str]:
    registry.register(f"{RADIX_CLASS}.__init__", after_init, hook_type.AFTER)
    registry.register(f"{RADIX_CLASS}.init_load_back", init_load_back, hook_type.AROUND)
    registry.register(f"{RADIX_CLASS}.reset", reset, hook_type.AROUND)
    hooked = [f"{RADIX_CLASS}.__init__/.init_load_back/.reset (quarantined loads, per-store locks, FlexKV flushed)"]
    if scheduler_loaded:  # the scheduler process (scheduler.py:6323 loads the plugins): its flush reports failure
        registry.register(FLUSH_CACHE, flush_cache, hook_type.AROUND)
        hooked.append(f"{FLUSH_CACHE} (a FlexKV that could not be emptied fails the flush)")
    return hooked


__all__ = ["FlushError", "flush", "register_radix_hooks"]
