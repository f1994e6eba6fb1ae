"""SGLang 0.5.23's scheduling steps on CPU, over the radix harness, and what FlexKV's real KVManager holds after them.

A scheduler needs a model runner, which CPU has not; its steps are SGLang's own code, called in the order
``Scheduler.get_new_batch_prefill`` calls them (managers/scheduler.py:4150-4300): ``SchedulePolicy.calc_priority``
over the waiting queue (LPM matches every request first, schedule_policy.py:356), then per request
``Req.init_next_round_input`` (``match_kv_cache`` -> ``FlexKVRadixCache.match_prefix``) and
``PrefillAdder.add_one_req`` (its budget, ``init_load_back``, the prefix lock), until one is not admitted. An
admitted request gets its row and extend slots as ``alloc_for_extend`` does (mem_cache/allocation.py:374-487) and
is finished as the result processor finishes it (``release_kv_cache(..., checkpoint=True)``,
batch_result_processor.py:1466: FlexKV's store starts, ``on_release`` runs).

What FlexKV holds is read from its own task engine and CPU cache engine, never from the plugin.
"""

from __future__ import annotations

import importlib
import time
from array import array
from typing import Any

import torch

from .radix_harness import Rig, write

PAGE = 16


def new_req(rid: str, prompt: list[int], max_new_tokens: int = 16) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=max_new_tokens))


def schedule(rig: Rig, policy: str, waiting: list[Any], rem_input_tokens: int = 10_000) -> tuple[list[Any], Any]:
    """One prefill-batch build: (the admitted requests, the verdict that stopped it or CONTINUE)."""
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy

    SchedulePolicy(policy, rig.cache, False, False, False).calc_priority(waiting)
    adder = PrefillAdder(PAGE, rig.cache, rig.alloc, None, 1.0, rem_input_tokens, None)
    verdict = AddReqResult.CONTINUE
    for req in waiting:
        req.init_next_round_input(rig.cache)
        verdict = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if verdict != AddReqResult.CONTINUE:
            break
    return list(adder.can_run_list), verdict


def allocate(rig: Rig, req: Any, seed: int) -> torch.Tensor:
    """alloc_for_extend for an admitted request: its row (the prefix read off the tree) and extend slots, which its
    forward pass writes (bytes from ``seed``). Its own slots."""
    rig.r2t.alloc([req])
    prefix = rig.cache.prefix_device_indices(req).long() if req.prefix_len else torch.empty(0, dtype=torch.long)
    own = rig.alloc.alloc(req.extend_end - req.prefix_len)
    assert own is not None
    rig.r2t.write((req.kv.req_pool_idx, slice(0, req.extend_end)), torch.cat([prefix, own.long()]))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end
    write(rig.pool, own, seed)
    return own


def finish(rig: Rig, req: Any) -> None:
    """The result processor on a finished request (batch_result_processor.py:1466)."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    release_kv_cache(req, rig.cache, checkpoint=True)


def abort(rig: Rig, req: Any) -> None:
    """Scheduler._release_aborted_request (scheduler.py:3545-3548) on an admitted request: its KV released
    unpublished (release_kv_cache(..., checkpoint=False), scheduler.py:3819), then the cache's abort path."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome
    from sglang.srt.mem_cache.common import release_kv_cache

    release_kv_cache(req, rig.cache, checkpoint=False)
    rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)


def settle(rig: Rig, timeout_s: float = 60.0) -> None:
    """The scheduler's ticks until FlexKV reported every store complete (its copies run in its own processes)."""
    deadline = time.monotonic() + timeout_s
    while rig.cache._inflight_store_nodes and time.monotonic() < deadline:
        rig.cache.check_hicache_events()
        time.sleep(0.01)
    assert not rig.cache._inflight_store_nodes, "FlexKV did not complete the store"


def stored_and_evicted(rig: Rig, rid: str, prompt: list[int], seed: int) -> None:
    """A request computes ``prompt``, finishes (FlexKV stores it) and leaves the device tree."""
    req = new_req(rid, prompt)
    admitted, _ = schedule(rig, "fcfs", [req])
    assert admitted == [req] and req.prefix_len == 0
    allocate(rig, req, seed)
    finish(rig, req)
    settle(rig)
    assert rig.evict_all() == len(prompt)


def flush(rig: Rig) -> None:
    """Scheduler.flush_cache (scheduler.py:5523-5525): FlexKV emptied (its pending lookups cancelled), SGLang's
    tree and pools reset."""
    rig.cache.reset()
    rig.r2t.clear()
    rig.alloc.clear()
    assert not rig.cache.flexkv_connector.stale


def never_launched_gets(rig: Rig) -> list[int]:
    """FlexKV's get tasks that were neither launched nor cancelled (its task table, kvtask.py:212)."""
    manager = rig.cache.flexkv_connector.manager
    manager.try_wait([])  # any KVManager call steps FlexKV's task engine
    tasks = list(manager.kv_task_engine.tasks.items())
    return [tid for tid, task in tasks if _name(task, "task_type") == "GET" and _name(task, "status") in WAITING]


WAITING = ("UNREADY", "READY")


def _running(manager: Any) -> list[int]:
    manager.try_wait([])  # any KVManager call steps FlexKV's task engine (its _update_tasks)
    return [tid for tid, task in list(manager.kv_task_engine.tasks.items()) if _name(task, "status") == "RUNNING"]


def _name(task: Any, field: str) -> str | None:
    return getattr(getattr(task, field, None), "name", None)  # the table's two int entries have neither


def blocks_flexkv_cannot_evict(rig: Rig) -> int:
    """FlexKV's own CPU eviction asked to free every block it holds, as ``take`` evicts under pressure (its radix
    index's ``evict``, then the mempool's ``recycle_blocks``: cache_engine.py:517-522, :795-796): the blocks
    left, which a task locks (or a store has not made ready)."""
    manager = rig.cache.flexkv_connector.manager
    running = _running(manager)
    deadline = time.monotonic() + 30.0
    while running and time.monotonic() < deadline:  # FlexKV unlocks a load's blocks at a later engine step
        time.sleep(0.01)
        running = _running(manager)
    assert not running, f"FlexKV's tasks {running} did not finish"
    cpu = manager.kv_task_engine.cache_engine.cpu_cache_engine
    used = cpu.mempool.num_total_blocks - cpu.mempool.num_free_blocks
    if used:
        if isinstance(cpu, importlib.import_module("flexkv.cache.cache_engine").CacheEngineAccel):  # the C++ index
            blocks, hashes = torch.zeros(used, dtype=torch.int64), torch.zeros(used, dtype=torch.int64)
            freed = cpu.index.evict(blocks, hashes, used)  # may resize them in place (cache_engine.py:514-521)
            evicted = blocks.resize_(freed).numpy()
        else:
            evicted, _ = cpu.index.evict(used)
        cpu.mempool.recycle_blocks(evicted)
    return int(cpu.mempool.num_total_blocks - cpu.mempool.num_free_blocks)
