"""Decode retraction (SGLang 0.5.23) with FlexKV behind ``FlexKVRadixCache``, through the plugin's bridge.

Under memory pressure ``ScheduleBatch.retract_decode`` (managers/schedule_batch.py:3450-3490) calls
``release_req`` (:2360-2395): ``release_kv_cache(req, tree_cache, checkpoint=False)`` (mem_cache/common.py:400-444)
frees the request's own slots and drops its radix lock, ``evict_from_tree_cache`` (:283-289) evicts at once what
that made evictable, and ``req.reset_for_retract()`` (schedule_batch.py:2049-2100) rewinds the request for its
re-admission. Here SGLang's real ``release_req`` runs on SGLang's real ``Req``, whose KV record is set up step by
step as the scheduler does (the scheduler itself needs a model runner, which CPU has not): admission as
``PrefillAdder.add_one_req`` (managers/schedule_policy.py:1517-1571, 1690: ``init_next_round_input`` ->
``match_kv_cache``, ``init_load_back``, the prefix lock), slots as ``alloc_for_extend`` / ``alloc_for_decode``
(mem_cache/allocation.py:374-487, 625-687), and a finished request released as the result processor does
(``release_kv_cache(..., checkpoint=True)``, batch_result_processor.py:1466), which starts FlexKV's store. The
radix cache, pools, paged allocator and ReqToTokenPool are SGLang's; FlexKV's connector is FlexKV 34ab141's own,
over the KVManager stand-in of ``flexkv_faults``, whose store copies the source slots at its second completion
poll (a copy still running when SGLang evicts), and in one test over FlexKV's real KVManager, task engine and
transfer processes. SGLang's default config is published for ``release_req`` with SGLang's own test facility
(``RuntimeContext.override_server_args``).
"""

from __future__ import annotations

import time
from array import array
from typing import Any

import pytest
import torch

from flexkv_adapter.integrations.sglang.bridge import handle_key

from . import flexkv_faults
from . import test_sglang_bridge_flexkv_kvmanager as real_kvmanager
from .radix_harness import Rig, buffers, read, retake, untouched_outside, write
from .real_flexkv import needs_flexkv

faulty = flexkv_faults.faulty  # the fixture: FlexKV's connector over a KVManager stand-in
flexkv = real_kvmanager.flexkv  # the fixture: FlexKV's real KVManager, task engine and transfer processes
PAGE = 16
IDS = list(range(1000, 1048))  # A's 48 tokens (32 prompt, 16 decoded): the prefix FlexKV stores
OWN = list(range(3000, 3016))  # B's own prompt page after that prefix
DECODED = list(range(4000, 4016))  # the page B decoded before it was retracted
PRESSURE = 3  # requests left in the batch: release_req evicts room for 3 * SGLANG_RETRACT_DECODE_STEPS (20) tokens


@pytest.fixture
def published():
    """SGLang's default server config, published as SGLang's own tests do and restored after: ``release_req``
    reads its ``disagg``, ``spec`` and ``serving`` bags."""
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args() as args:
        yield args


@pytest.fixture
def rig(faulty, published, models, monkeypatch) -> Rig:
    return Rig(monkeypatch, models["llama"], "mha")


def _admit(rig: Rig, req: Any) -> torch.Tensor | None:
    """The scheduler's admission of ``req`` (FlexKV lookup and load, the prefix lock, its row and extend slots):
    the slots FlexKV loaded, or None."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

    req.init_next_round_input(rig.cache)  # match_kv_cache -> FlexKVRadixCache.match_prefix: the FlexKV lookup
    loaded = None
    if req.host_hit_length > 0:  # schedule_policy.py:1517-1571
        req.host_loaded_length, req.last_node = rig.cache.init_load_back(
            InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
        )
        req.prefix_len += req.host_loaded_length
        req.kv.cache_protected_len = req.prefix_len  # load_back_is_cache_owned()
        loaded = req.last_node.value if req.host_loaded_length else None
    req.extend_end = len(req.full_untruncated_fill_ids)
    req.lock = rig.cache.lock(req.last_node)  # _commit_prefill_admission (:1690)
    rig.r2t.alloc([req])  # alloc_for_extend: the row, the prefix read off the tree, the extend slots
    prefix = rig.cache.prefix_device_indices(req).long() if req.prefix_len else torch.empty(0, dtype=torch.long)
    own = rig.alloc.alloc(req.extend_end - req.prefix_len)  # every length here is page-aligned
    assert own is not None
    rig.r2t.write((req.kv.req_pool_idx, slice(0, req.extend_end)), torch.cat([prefix, own.long()]))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end
    return loaded


def _running(rig: Rig, rid: str, prompt: list[int], decoded: list[int], seed: int) -> tuple[Any, Any, torch.Tensor]:
    """A real ``Req`` admitted, prefilled and decoded (``decoded`` appended, one slot each): (req, the slots
    FlexKV loaded for it or None, its own slots, holding bytes its forward passes wrote from ``seed``)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=64))
    loaded = _admit(rig, req)
    prefilled = rig.r2t.req_to_token[req.kv.req_pool_idx, req.prefix_len : req.extend_end].long()
    steps = rig.alloc.alloc(len(decoded))  # alloc_for_decode, a page of steps at once
    start = req.kv.kv_allocated_len
    rig.r2t.write((req.kv.req_pool_idx, slice(start, start + len(decoded))), steps)
    req.output_ids.extend(decoded)
    req.kv.kv_allocated_len += len(decoded)
    req.kv.kv_committed_len += len(decoded)
    own = torch.cat([prefilled, steps.long()])
    write(rig.pool, own, seed)
    return req, loaded, own


def _finish(rig: Rig, req: Any) -> None:
    """The result processor on a finished request (batch_result_processor.py:1466): FlexKV's store starts."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    release_kv_cache(req, rig.cache, checkpoint=True)


def _retract(rig: Rig, req: Any) -> None:
    """ScheduleBatch.release_req (schedule_batch.py:3582-3596) as retract_decode calls it (:3488)."""
    from sglang.srt.managers.schedule_batch import release_req

    assert release_req(
        req=req, remaing_req_count=PRESSURE, req_to_token_pool=rig.r2t, token_to_kv_pool_allocator=rig.alloc,
        tree_cache=rig.cache, hisparse_coordinator=None,
    )  # fmt: skip


def _free(rig: Rig) -> set[int]:
    pages = rig.alloc.get_all_free_pages()
    return set((pages[:, None] * PAGE + torch.arange(PAGE)).reshape(-1).tolist())


def _poll(rig: Rig, times: int = 3) -> None:
    for _ in range(times):
        rig.cache.check_hicache_events()  # the scheduler's tick: FlexKV's copies run, completions come back


def _settle(rig: Rig, timeout_s: float = 60.0) -> None:
    """The scheduler's ticks until FlexKV reported every store complete (FlexKV's real KVManager copies in its
    own processes)."""
    deadline = time.monotonic() + timeout_s
    while rig.cache._inflight_store_nodes and time.monotonic() < deadline:
        rig.cache.check_hicache_events()
        time.sleep(0.01)
    assert not rig.cache._inflight_store_nodes, "FlexKV did not complete the store"


def _unfinished_tasks(rig: Rig, timeout_s: float = 30.0) -> list[Any]:
    """FlexKV's tasks that do not finish: its real task table (KVTaskEngine.tasks), or the stand-in's. FlexKV
    answers a load once its data landed and retires the task at a later engine step (kvtask.py:755-776, 832-870):
    any KVManager call steps it, here an empty ``try_wait``, until the deadline."""
    kv = rig.cache.flexkv_connector.manager
    engine = getattr(kv, "kv_task_engine", None)
    deadline = time.monotonic() + timeout_s
    while True:
        kv.try_wait([])
        if engine is not None:  # (the pinned ExpiringDict may hold two int entries: not tasks)
            left = [t for t in list(engine.tasks.values()) if hasattr(t, "is_completed") and not t.is_completed()]
        else:
            left = [t for t in kv.tasks.values() if t.status not in ("success", "cancelled", "failed")]
            left += list(kv.reserved)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def _flexkv_holds_nothing_for(rig: Rig, req: Any) -> bool:
    """No held lookup, store, load marker or quarantine for ``req``; no FlexKV task left unfinished."""
    bridge = rig.cache.flexkv_connector
    connector, key = bridge.connector, handle_key(req.cache_request_handle)
    return (
        key not in connector._pending_lookups
        and key not in connector._pending_lookup_contexts
        and not connector._inflight_stores
        and not _unfinished_tasks(rig)
        and req.cache_request_handle not in rig.cache._load_markers
        and not rig.cache._inflight_store_nodes
        and not len(bridge.quarantine)
    )


def _readmit(rig: Rig, b: Any, elsewhere: torch.Tensor, running: torch.Tensor) -> dict[str, Any]:
    """Room comes back (another request finishes) and B is admitted again; ``elsewhere`` stays taken."""
    rig.alloc.free(running[: 5 * PAGE])
    before = [t.clone() for t in buffers(rig.pool)]
    again = _admit(rig, b)
    return {
        "loaded": again,
        "elsewhere": again is not None and not set(again.tolist()) & set(elsewhere.tolist()),
        "bytes": None if again is None else read(rig.pool, again),
        "others untouched": again is not None and untouched_outside(before, rig.pool, again),
        "flexkv clean": _flexkv_holds_nothing_for(rig, b),
    }


def _retracted_and_readmitted(rig: Rig) -> None:
    """A is stored into FlexKV and evicted; B runs on A's prefix, loaded from FlexKV; the pool fills; B is
    retracted; the room goes to the others; B is admitted again once room comes back."""
    a, _, a_slots = _running(rig, "a", IDS[:32], IDS[32:], seed=7)
    expected = read(rig.pool, a_slots)
    _finish(rig, a)
    _settle(rig)
    assert rig.evict_all() == len(IDS)  # A is in FlexKV only
    b, first, b_own = _running(rig, "b", IDS + OWN, DECODED, seed=8)
    assert first is not None and len(first) == len(IDS) and read(rig.pool, first) == expected
    running = rig.alloc.alloc(rig.alloc.available_size())  # the other running requests fill the pool
    held = set(first.tolist()) | set(b_own.tolist())
    assert not held & _free(rig)

    _retract(rig, b)

    assert held <= _free(rig)  # B's own slots, and its FlexKV-loaded prefix (evicted: nothing else locks it)
    assert rig.cache.evictable_size() == rig.cache.protected_size() == 0
    assert not b.kv.holds_kv and b.lock is None and b.is_retracted and b.prefix_len == 0
    assert _flexkv_holds_nothing_for(rig, b)
    reused = rig.alloc.alloc(rig.alloc.available_size())  # the room goes to the requests that stayed
    assert set(first.tolist()) <= set(reused.tolist())
    write(rig.pool, reused, seed=99)

    out = _readmit(rig, b, reused, running)

    assert out["loaded"] is not None and len(out["loaded"]) == len(IDS) and out["elsewhere"]
    assert out["bytes"] == expected and out["others untouched"] and out["flexkv clean"]


def test_a_retracted_request_frees_its_slots_and_is_restored_byte_exact_when_admitted_again(rig):
    """B's prefix came from FlexKV: the retraction frees all of B's slots at once, FlexKV keeps no task for B, and
    B's re-admission restores that prefix from FlexKV into other slots, byte for byte, writing nowhere else."""
    _retracted_and_readmitted(rig)


@needs_flexkv
def test_a_retracted_request_is_restored_byte_exact_through_flexkvs_real_kvmanager(
    flexkv, published, models, monkeypatch
):
    """The same on FlexKV's own KVManager, task engine and transfer processes: its task table keeps nothing."""
    _, rigs = flexkv
    rig = Rig(monkeypatch, models["llama"], "mha")  # FlexKV starts here (~20 s)
    rigs.append(rig)
    _retracted_and_readmitted(rig)


def _store_in_flight_during_a_retraction(rig: Rig, drop_store_lock: bool) -> dict[str, Any]:
    """A finishes (FlexKV's store of its slots starts); B, running on A's prefix, is retracted before the store
    has copied anything; the room goes to the others at once; the store completes; B is admitted again.
    ``drop_store_lock``: A's store lock is dropped at once (the protection removed)."""
    a, _, a_slots = _running(rig, "a", IDS[:32], IDS[32:], seed=7)
    expected = read(rig.pool, a_slots)
    _finish(rig, a)
    assert a.cache_request_handle in rig.cache._inflight_store_nodes  # the store's radix lock
    if drop_store_lock:
        rig.cache.dec_lock_ref(rig.cache._inflight_store_nodes.pop(a.cache_request_handle))
    b, loaded, _ = _running(rig, "b", IDS + OWN, DECODED, seed=8)
    assert loaded is None and b.prefix_len == len(IDS)  # B runs on A's node, on the device
    running = rig.alloc.alloc(rig.alloc.available_size())
    asked: list[int] = []
    evict = rig.cache.evict
    rig.cache.evict = lambda params: asked.append(params.num_tokens) or evict(params)  # type: ignore[method-assign]

    _retract(rig, b)

    del rig.cache.evict
    out = {"store still running": bool(rig.cache.flexkv_connector.connector._inflight_stores)}
    out["kept"] = not set(a_slots.tolist()) & _free(rig)
    out["eviction asked"] = asked
    out["evictable"], out["protected"] = rig.cache.evictable_size(), rig.cache.protected_size()
    reused = rig.alloc.alloc(rig.alloc.available_size())
    write(rig.pool, reused, seed=99)  # the others' forward passes
    _poll(rig)  # FlexKV's copy lands, the completion unlocks A's node
    out["evicted later"] = rig.evict_all()
    if free_again := [s for s in a_slots.tolist() if s in _free(rig)]:
        retake(rig.alloc, torch.tensor(free_again))  # A's slots go to others: B's restore goes elsewhere
    out.update(_readmit(rig, b, a_slots, running))
    out["exact"] = out["bytes"] == expected
    return out


def test_a_finished_requests_inflight_store_keeps_its_slots_through_a_retractions_eviction(rig):
    """release_req's eviction runs while FlexKV still copies A's slots: the store's radix lock keeps them, and
    A's bytes are restored exactly once the store has completed."""
    out = _store_in_flight_during_a_retraction(rig, drop_store_lock=False)
    assert out["eviction asked"] == [PRESSURE * 20 - 2 * PAGE]  # release_req's eviction ran (B freed 2 pages)...
    assert out["store still running"]  # ...while FlexKV had not copied A's slots
    assert out["kept"] and out["evictable"] == 0 and out["protected"] == len(IDS)
    assert out["evicted later"] == len(IDS)  # given back once the store completed, not held forever
    assert out["loaded"] is not None and len(out["loaded"]) == len(IDS) and out["elsewhere"]
    assert out["exact"] and out["others untouched"] and out["flexkv clean"]


def test_negative_control_without_the_store_lock_the_retractions_eviction_hands_out_slots_flexkv_still_copies(rig):
    """The same sequence with A's store lock dropped at once (what SGLang's own release_aborted_request does):
    the retraction's eviction frees A's slots, the others write there, FlexKV copies their bytes under A's
    prefix, and B's restore differs: what the store lock prevents, and what the test above would catch."""
    out = _store_in_flight_during_a_retraction(rig, drop_store_lock=True)
    assert out["eviction asked"] == [PRESSURE * 20 - 2 * PAGE] and out["store still running"]
    assert not out["kept"]  # the retraction's eviction freed them while FlexKV still had to copy them
    assert out["loaded"] is not None and len(out["loaded"]) == len(IDS)  # FlexKV serves the prefix...
    assert not out["exact"]  # ...with the others' bytes
