"""FlexKV 34ab141's KVManager behaviours the SGLang bridge must survive, over the CPU data plane of ``flexkv_serving``.

Written from ``flexkv/kvtask.py`` and ``flexkv/kvmanager.py`` (no code copied):

* ``wait`` past its deadline answers TIMEOUT and leaves the task RUNNING; the copy still lands later
  (kvtask.py:1097-1104), here after :attr:`Faults.delay` engine ticks (any later KVManager call);
* a failed copy answers FAILED once the graph drained (``_fail_task``, kvtask.py:712-733);
* ``launch`` over a closed transfer pipe raises ``BrokenPipeError`` (server-client mode) and leaves the
  task as created;
* a put task holds its unmatched pages as unready index nodes until it completes or is cancelled: they
  shadow later puts of the same prefix (kvtask.py:735-756); cancelling a RUNNING task only forgets it
  (``not_found`` afterwards) while its copy goes on;
* ``reset`` drops every cached page (``reset_cache``, kvtask.py:1446-1489; kvmanager.py:383-388).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from . import flexkv_standin as fk
from .flexkv_serving import DataKVManager, _Task


@dataclass
class Faults:
    get: str = ""  # "" | "failed" | "timeout" | "raise": what the next loads' copies do
    put: str = ""  # "" | "raise"
    reset: str = ""  # "" | "raise" | "noop"
    cancel: str = ""  # "" | "raise": KVManager.cancel raises (e.g. FlexKV's pipe closed)
    delay: int = 2  # engine ticks before a timed-out copy lands
    leader_only: bool = True  # (only the leader has a KVManager: kept for readability of the TP tests)


FAULTS = Faults()


def reset_faults() -> None:
    FAULTS.__init__()  # type: ignore[misc]


@dataclass
class FaultyKVManager(DataKVManager):
    late: dict[int, int] = field(default_factory=dict)  # task id -> ticks before its copy lands
    reserved: dict[tuple[int, ...], int] = field(default_factory=dict)  # page -> the put task holding it unready
    forgotten: set[int] = field(default_factory=set)  # cancelled while running: not_found, the copy goes on
    resets: int = 0

    def advance(self, ticks: int) -> None:
        """Time passes: FlexKV's transfer engine runs on its own, whatever the scheduler calls."""
        for _ in range(ticks):
            self._tick()

    def _tick(self) -> None:
        for tid in list(self.late):
            self.late[tid] -= 1
            if self.late[tid] <= 0:
                del self.late[tid]
                self._run(self.tasks[tid])  # the copy lands (into whatever the slots hold now)
                fk.CALLS.append(("late copy", {"task_id": tid}))

    def get_match(self, token_ids: np.ndarray, token_mask: np.ndarray, swa_aware: bool = False,
                  namespace: Any = None) -> tuple[int, Any]:  # fmt: skip
        self._tick()
        return super().get_match(token_ids, token_mask, namespace=namespace, swa_aware=swa_aware)

    def put_match(self, token_ids: np.ndarray, token_mask: Any = None, *, namespace: Any = None) -> tuple[int, Any]:
        self._tick()
        missing = [p for p in self._prefixes(token_ids, namespace) if p not in self.pages and p not in self.reserved]
        mask = np.zeros(len(token_ids), dtype=bool)
        for p in missing:
            mask[self._end(p) - self.page : self._end(p)] = True
        tid = self._new(_Task("put", missing, [self.page] * len(missing)))
        self.reserved.update(dict.fromkeys(missing, tid))
        return tid, mask

    def _unreserve(self, tid: int) -> None:
        for page in [p for p, holder in self.reserved.items() if holder == tid]:
            del self.reserved[page]

    def _run(self, task: _Task) -> None:
        super()._run(task)
        if task.kind == "put":
            self._unreserve(next(t for t, v in self.tasks.items() if v is task))

    def launch(self, task_ids: list[int], slot_mappings: list[Any], **kwargs: Any) -> list[int]:
        self._tick()
        kinds = {self.tasks[t].kind for t in task_ids}
        if ("get" in kinds and FAULTS.get == "raise") or ("put" in kinds and FAULTS.put == "raise"):
            fk.CALLS.append(("launch raised", {"task_ids": list(task_ids)}))
            raise BrokenPipeError(32, "Broken pipe")
        return super().launch(task_ids, slot_mappings, **kwargs)

    def wait(self, task_ids: list[int], timeout: float = 20.0, completely: bool = False) -> dict[int, Any]:
        self._tick()
        out = {}
        for tid in task_ids:
            task = self.tasks[tid]
            if task.kind == "get" and task.status == "running" and FAULTS.get == "failed":
                task.status = "failed"
            elif task.kind == "get" and task.status == "running" and FAULTS.get == "timeout":
                self.late.setdefault(tid, FAULTS.delay)
                out[tid] = SimpleNamespace(status="timeout")
                continue
            out.update(super().wait([tid], timeout, completely))
        return out

    def try_wait(self, task_ids: list[int]) -> dict[int, Any]:
        self._tick()
        out = {}
        for tid in task_ids:
            if tid in self.forgotten:
                out[tid] = SimpleNamespace(status="not_found")
            elif tid in self.late:
                out[tid] = SimpleNamespace(status="running")
            else:
                out.update(super().try_wait([tid]))
        return out

    def cancel(self, task_ids: list[int]) -> None:
        fk.CALLS.append(("cancel", {"task_ids": list(task_ids)}))
        if FAULTS.cancel == "raise":
            raise BrokenPipeError("FlexKV's transfer pipe is closed")
        for tid in task_ids:
            task = self.tasks[tid]
            if task.status in ("success", "failed", "cancelled"):
                continue
            if task.status == "running":
                self.forgotten.add(tid)  # FlexKV forgets it; the transfer graph runs on
            else:
                self._unreserve(tid)  # never launched: the plan is rolled back
            task.status = "cancelled"

    def reset(self) -> None:
        fk.CALLS.append(("KVManager.reset", {}))
        if FAULTS.reset == "raise":
            raise RuntimeError("[FlexKV] reset failed: the server did not answer")
        if FAULTS.reset == "noop":
            return
        self.resets += 1
        self.pages.clear()
        self.reserved.clear()


def use_faulty_manager(monkeypatch: Any) -> Any:
    """FlexKV's real connector module (already prepared) with this KVManager; the faults reset."""
    import importlib

    reset_faults()
    connector = importlib.import_module("flexkv.integration.sglang.connector")
    monkeypatch.setattr(connector, "KVManager", FaultyKVManager)
    return connector


@pytest.fixture
def faulty(sglang_env: Any, monkeypatch: Any) -> Faults:
    """The plugin loaded over FlexKV's real connector (tests/flexkv_source.py finds it) with this KVManager."""
    return load_faulty(sglang_env, monkeypatch)


def load_faulty(sglang_env: Any, monkeypatch: Any) -> Faults:
    from tests.flexkv_source import find

    from .real_flexkv import prepare, replace_gpu_parts

    found = find()
    if found.root is None:
        pytest.skip(found.skip_reason)
    prepare(monkeypatch, str(found.root))
    sglang_env.load()
    replace_gpu_parts(monkeypatch)
    use_faulty_manager(monkeypatch)
    return FAULTS


def manager(rig: Any) -> FaultyKVManager:
    """The leader's KVManager (behind the bridge's observer, if any)."""
    kv = rig.cache.flexkv_connector.connector.kv_manager
    return getattr(kv, "manager", kv)  # type: ignore[no-any-return]


def stored(rig: Any, rid: str, ids: list[int], seed: int) -> list[bytes]:
    """A finished request stored into FlexKV (its copy done) and evicted from the device: its bytes."""
    from .radix_harness import read

    req = rig.request(rid, ids, prompt=40, seed=seed)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    for _ in range(3):
        rig.cache.check_hicache_events()
    rig.evict_all()
    return expected
