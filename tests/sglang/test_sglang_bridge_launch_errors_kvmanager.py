"""A launch that raises in FlexKV's REAL KVManager leaves nothing behind: the prefix is offloaded again, nothing pinned.

FlexKV 34ab141's ``launch_tasks`` marks a task RUNNING (kvtask.py:815-830) before it sends the graph to its
transfer process; with that process gone the send raises ``BrokenPipeError`` (transfer_manager.py:1202-1212)
and no transfer ever takes the graph. The bridge cancels the task, but FlexKV's cancel rolls back only a task
that never got that far (kvtask.py:735-756): a store's unready index nodes shadowed the prefix for good (the
next store of it started nothing, a lookup loaded 0 tokens) and a load's matched blocks stayed locked. The
bridge puts such a task back to READY before the cancel (``flexkv_adapter.integrations.sglang.unlaunched``).

SGLang 0.5.23's ``FlexKVRadixCache`` -> the bridge -> FlexKV's connector, KVManager, task engine, radix index and
transfer processes, one rank. The closed pipe is FlexKV's own send raising, for one launch. Negative control (the
same FlexKV, started once): the same with the bridge's cancel as FlexKV's alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from flexkv_adapter.integrations.sglang import bridge as bridge_module

from . import test_sglang_bridge_flexkv_kvmanager as real_kvmanager
from .radix_harness import Rig, read, zero
from .real_flexkv import needs_flexkv
from .scheduling import blocks_flexkv_cannot_evict, flush, settle
from .test_sglang_bridge import IDS

pytestmark = needs_flexkv
flexkv = real_kvmanager.flexkv  # the fixture: FlexKV's real KVManager, task engine and transfer processes


class _ClosedPipe:
    """FlexKV's pipe to its transfer process, once that process is gone: every send raises."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def send(self, obj: Any) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


@contextlib.contextmanager
def _transfer_process_gone(rig: Rig) -> Iterator[None]:
    handle = rig.cache.flexkv_connector.manager.kv_task_engine.transfer_handles[0]._handle
    conn = handle.command_parent_conn
    handle.command_parent_conn = _ClosedPipe(conn)
    try:
        yield
    finally:
        handle.command_parent_conn = conn


def _store_raises_then_again(rig: Rig) -> dict[str, Any]:
    """A finished request's store launch raises; the next request with the same prompt is stored and restored."""
    with _transfer_process_gone(rig):
        rig.finish(rig.request("r1", IDS, prompt=40, seed=7))
    out: dict[str, Any] = {"locked": rig.cache.protected_size(), "in flight": len(rig.cache._inflight_store_nodes)}
    rig.evict_all()
    again = rig.request("r2", IDS, prompt=40, seed=8)
    expected = read(rig.pool, again.slots)
    rig.finish(again)
    out["stored again"] = len(rig.cache._inflight_store_nodes)  # FlexKV started a store of the prefix
    settle(rig)
    rig.evict_all()
    zero(rig.pool, again.slots)
    loaded, slots = rig.match_and_load(rig.request("r3", IDS, prompt=40, allocate=False))
    out["restored"] = (loaded, slots is not None and read(rig.pool, slots) == expected)
    return out


def _load_raises_then_again(rig: Rig) -> dict[str, Any]:
    """A load's launch raises (a miss, its slots freed); the next load is served; then FlexKV's eviction."""
    req = rig.request("s1", IDS, prompt=40, seed=9)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    settle(rig)
    rig.evict_all()
    free = rig.alloc.available_size()
    with _transfer_process_gone(rig):
        failed = rig.match_and_load(rig.request("s2", IDS, prompt=40, allocate=False))
    out: dict[str, Any] = {"failed": (failed, rig.alloc.available_size() == free)}
    loaded, slots = rig.match_and_load(rig.request("s3", IDS, prompt=40, allocate=False))
    out["served"] = (loaded, slots is not None and read(rig.pool, slots) == expected)
    settle(rig)
    out["pinned blocks"] = blocks_flexkv_cannot_evict(rig)
    return out


def test_a_launch_that_raises_leaves_the_prefix_offloadable_and_nothing_pinned(flexkv, models, monkeypatch):
    _, rigs = flexkv
    rig = Rig(monkeypatch, models["llama"], "mha")  # FlexKV starts here (~20 s), once for every case below
    rigs.append(rig)
    store = _store_raises_then_again(rig)
    assert (store["locked"], store["in flight"]) == (0, 0)  # nothing stored, the node unlocked
    assert store["stored again"] == 1  # the next store of the prefix started
    assert store["restored"] == (len(IDS), True)  # and FlexKV serves it byte for byte
    flush(rig)
    load = _load_raises_then_again(rig)
    assert load["failed"] == ((0, None), True)  # a miss, its slots given back
    assert load["served"] == (len(IDS), True)
    assert load["pinned blocks"] == 0  # FlexKV's eviction frees every block: the failed load locks none
    flush(rig)

    # negative control: the bridge's cancel as FlexKV's alone
    monkeypatch.setattr(bridge_module, "cancel_unlaunched", lambda manager, task_ids: manager.cancel(task_ids))
    store = _store_raises_then_again(rig)
    assert store["stored again"] == 0  # FlexKV's put_match counts the failed store's unready nodes as present
    assert store["restored"] == (0, False)  # and its get_match never serves them
    flush(rig)
    load = _load_raises_then_again(rig)
    assert load["served"] == (len(IDS), True)
    assert load["pinned blocks"] == len(IDS) // 16  # the failed load's get task still locks the prefix's 3 blocks


@pytest.mark.parametrize("handles", [0, 2])
def test_a_task_is_put_back_only_where_no_transfer_can_have_taken_it(handles):
    """No task engine in this process (FlexKV's server-client mode), or several transfer handles (an earlier one
    may have taken the graph): FlexKV's cancel alone."""
    from types import SimpleNamespace

    from flexkv_adapter.integrations.sglang.unlaunched import cancel_unlaunched

    class Status:
        name = "RUNNING"
        READY = "ready"

    task = SimpleNamespace(status=Status())
    cancelled: list[Any] = []
    engine = SimpleNamespace(tasks={3: task}, transfer_handles=[object()] * handles) if handles else None
    manager = SimpleNamespace(kv_task_engine=engine, cancel=cancelled.append)
    assert cancel_unlaunched(manager, [3]) == [] and isinstance(task.status, Status) and cancelled == [[3]]
    engine = SimpleNamespace(tasks={3: task}, transfer_handles=[object()])
    assert cancel_unlaunched(SimpleNamespace(kv_task_engine=engine, cancel=cancelled.append), [3]) == [3]
    assert task.status == "ready"  # control: one handle, put back
