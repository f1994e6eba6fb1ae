"""A stand-in for FlexKV's own SGLang connector at 34ab141 that serves: lookup, load, store, completion.

Written from ``flexkv/integration/sglang/connector.py`` (no code copied): the same public methods and
signatures (``rid`` keys, optional ``sglang_req_id``), and the behaviour the bridge depends on:

* only the sync leader (attention TP rank 0) talks to the ``KVManager``; its results are scattered to
  every rank (here: a gloo broadcast over the attention TP group; FlexKV uses tagged point-to-point);
* ``store_kv`` returns the task id on every rank, so every rank keeps its source slots until the host
  copy is terminal (#263); ``check_completed_stores`` is a collective; a store-key mismatch across
  ranks raises;
* a repeated lookup for the same ``rid`` cancels the task it replaces.

Behind it, :class:`DataKVManager` keeps whole pages keyed by their token prefix and copies the rows
of the tensors every TP rank registered with ``KVTPClient`` (this process's, plus the ones other
ranks handed over in :data:`PEER_REGISTRATIONS`, as FlexKV's server gets every rank's IPC handles).
A store's host copy runs at its second completion poll (it reads the GPU slots then, so slots freed
early would be caught). Layerwise loads and SWA slot mappings are left out; prefetch (a tier below
the CPU) is in ``flexkv_prefetch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import flexkv_standin as fk

_UNSET = object()
# tp rank -> the tensors that rank registered (shared memory), for ranks in other processes
PEER_REGISTRATIONS: dict[int, list[torch.Tensor]] = {}
TERMINAL = {"success", "failed", "cancelled", "not_found"}


def _status(response: Any) -> str:
    status = getattr(response, "status", None)
    return str(getattr(status, "value", status)).lower() if status is not None else "missing"


@dataclass
class _Task:
    kind: str  # "get" | "put"
    pages: list[tuple[Any, ...]]  # the token prefixes that end each page (after the namespace, if any)
    tokens_per_page: list[int]  # how many of the launched slots belong to each page
    slots: torch.Tensor | None = None
    status: str = "created"
    polls: int = 0


@dataclass
class DataKVManager:
    """``KVManager``'s task API over an in-memory CPU tier (whole pages, keyed by token prefix)."""

    model_config: Any
    cache_config: Any
    dp_client_id: int = 0
    server_recv_port: str = ""
    gpu_register_port: str = ""
    pages: dict[tuple[Any, ...], list[torch.Tensor]] = field(default_factory=dict)
    tasks: dict[int, _Task] = field(default_factory=dict)

    def start(self) -> None:
        pass

    def is_ready(self) -> bool:
        return True

    @property
    def page(self) -> int:
        return int(self.cache_config.tokens_per_block)

    def _new(self, task: _Task) -> int:
        tid = len(self.tasks) + 1
        self.tasks[tid] = task
        return tid

    def _prefixes(self, token_ids: np.ndarray, namespace: Any = None) -> list[tuple[Any, ...]]:
        """Each page's key: its token prefix, after the namespace (a tuple) if any (FlexKV's own hashing of it:
        test_sglang_bridge_namespaces_kvmanager.py)."""
        ids, space = [int(t) for t in token_ids], (tuple(namespace),) if namespace else ()
        return [space + tuple(ids[: end + self.page]) for end in range(0, len(ids) - self.page + 1, self.page)]

    @staticmethod
    def _end(prefix: tuple[Any, ...]) -> int:  # where the page keyed ``prefix`` ends in the token ids
        return len(prefix) - (1 if prefix and isinstance(prefix[0], tuple) else 0)

    # FlexKV 34ab141's KVManager signatures (kvmanager.py:199-313): the bridge's recorder passes them on by position
    def get_match(self, token_ids: np.ndarray, token_mask: Any = None, cpu_only: bool = False, namespace: Any = None,
                  swa_aware: bool = False) -> tuple[int, Any]:  # fmt: skip
        prefixes = self._prefixes(token_ids, namespace)
        cached = next((i for i, prefix in enumerate(prefixes) if prefix not in self.pages), len(prefixes))
        mask = np.zeros(len(token_ids), dtype=bool)
        mask[: cached * self.page] = True
        if token_mask is not None:  # FlexKV: no mask, every token
            mask &= np.asarray(token_mask, dtype=bool)
        pages = [p for i, p in enumerate(prefixes[:cached]) if mask[i * self.page : (i + 1) * self.page].any()]
        counts = [int(mask[self._end(p) - self.page : self._end(p)].sum()) for p in pages]
        fk.CALLS.append(("get_match", {"tokens": len(token_ids), "hit": int(mask.sum())}))
        return self._new(_Task("get", pages, counts, status="created" if pages else "success")), mask

    def put_match(self, token_ids: np.ndarray, token_mask: Any = None, namespace: Any = None) -> tuple[int, Any]:
        missing = [p for p in self._prefixes(token_ids, namespace) if p not in self.pages]
        mask = np.zeros(len(token_ids), dtype=bool)
        for p in missing:
            mask[self._end(p) - self.page : self._end(p)] = True
        return self._new(_Task("put", missing, [self.page] * len(missing))), mask

    def launch(self, task_ids: list[int], slot_mappings: list[torch.Tensor], swa_slot_mappings: Any = None,
               as_batch: bool = False, layerwise_transfer: bool = False, counter_id: int = 0) -> list[int]:  # fmt: skip
        for tid, slots in zip(task_ids, slot_mappings):
            task = self.tasks[tid]
            task.slots, task.status = slots.clone(), "running"
            fk.CALLS.append(("launch", {"kind": task.kind, "slots": slots.tolist()}))
        return task_ids

    def _ranks(self) -> list[list[torch.Tensor]]:
        """Every rank's registered tensors: this process's last registration, then the peers' (by rank)."""
        own = list(fk.calls("register_to_server")[-1]["kv_caches"])
        return [own] + [PEER_REGISTRATIONS[r] for r in sorted(PEER_REGISTRATIONS)]

    def _run(self, task: _Task) -> None:
        assert task.slots is not None
        chunks = torch.split(task.slots, task.tokens_per_page)
        for prefix, slots in zip(task.pages, chunks):
            if task.kind == "put":  # one page holds every rank's head shard
                self.pages[prefix] = [[t[slots].clone() for t in ts] for ts in self._ranks()]
            else:
                for ts, shard in zip(self._ranks(), self.pages[prefix], strict=True):
                    for t, rows in zip(ts, shard, strict=True):
                        t[slots] = rows[len(rows) - len(slots) :]
        task.status = "success"

    def wait(self, task_ids: list[int], timeout: float = 20.0, completely: bool = False) -> dict[int, Any]:
        for tid in task_ids:
            if self.tasks[tid].status == "running":
                self._run(self.tasks[tid])
        return {tid: SimpleNamespace(status=self.tasks[tid].status) for tid in task_ids}

    def try_wait(self, task_ids: list[int]) -> dict[int, Any]:
        """A store's host copy runs at its second poll; until then it reports running."""
        for tid in task_ids:
            task = self.tasks[tid]
            task.polls += 1
            if task.status == "running" and task.polls >= 2:
                self._run(task)
        return {tid: SimpleNamespace(status=self.tasks[tid].status) for tid in task_ids}

    def cancel(self, task_ids: list[int]) -> None:
        fk.CALLS.append(("cancel", {"task_ids": list(task_ids)}))
        for tid in task_ids:
            self.tasks[tid].status = "cancelled"

    def shutdown(self) -> None:
        fk.CALLS.append(("KVManager.shutdown", {}))


class Comm:
    """FlexKVComm reduced to attention TP: leader = rank 0 of the group; scatter = its payload everywhere."""

    def __init__(self, attn_tp_size: int, attn_tp_rank: int, attn_tp_group: Any) -> None:
        self.group = getattr(attn_tp_group, "cpu_group", attn_tp_group)
        self.is_sync_leader = attn_tp_rank == 0
        self.needs_sync = attn_tp_size > 1
        if self.needs_sync and self.group is None:
            raise RuntimeError(f"[FlexKV] attn_tp_size={attn_tp_size} > 1 but attn_tp_cpu_group is None")

    def scatter(self, data: Any, *, channel: str, blocking: bool = False) -> Any:
        box = [data]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.group)


class ServingFlexKVConnector(fk.OwnFlexKVConnector):
    """FlexKV's own connector (34ab141): construction as in ``flexkv_standin``, then its serving API."""

    def __init__(self, *, sgl_model_config, server_args, page_size, kvcache, tp_rank, dp_rank, pp_rank,
                 attn_cp_rank, pp_group=None, attn_tp_group=None, attn_cp_group=None):  # fmt: skip
        super().__init__(
            sgl_model_config=sgl_model_config, server_args=server_args, page_size=page_size, kvcache=kvcache,
            tp_rank=tp_rank, dp_rank=dp_rank, pp_rank=pp_rank, attn_cp_rank=attn_cp_rank,
        )  # fmt: skip
        mc = self.rank_info.model_config
        self._sync_ctx = Comm(mc.attn_tp_size, self.rank_info.attn_tp_rank, attn_tp_group)
        self.kv_manager = (
            DataKVManager(mc, fk.CacheConfig(tokens_per_block=self.page_size))
            if self._sync_ctx.is_sync_leader
            else None
        )
        self.enable_layerwise = False
        self._pending_lookups: dict[str, int] = {}
        self._inflight_stores: dict[str, int] = {}
        self._prefetch_enabled = False

    def lookup_kv(self, token_ids, token_mask, rid=None, sglang_req_id=_UNSET):
        fk.CALLS.append(("lookup_kv", {"rid": rid, "sglang_req_id": sglang_req_id}))
        tid, hit = -1, 0
        if self._sync_ctx.is_sync_leader:
            tid, mask = self.kv_manager.get_match(
                token_ids=np.asarray(token_ids, dtype=np.int64), token_mask=np.asarray(token_mask)
            )
            hit = int(mask.sum())
        if self._sync_ctx.needs_sync:
            payload = self._sync_ctx.scatter({"task_id": tid, "hit": hit}, channel="lookup")
            tid, hit = payload["task_id"], payload["hit"]
        hit = hit // self.page_size * self.page_size
        if hit > 0 and rid is not None and tid >= 0:
            replaced = self._pending_lookups.pop(rid, -1)
            if replaced >= 0 and replaced != tid and self._sync_ctx.is_sync_leader:
                self.kv_manager.cancel([replaced])  # a duplicate lookup cancels the task it replaces
            self._pending_lookups[rid] = tid
        elif hit > 0 and tid >= 0 and self._sync_ctx.is_sync_leader:
            self.kv_manager.cancel([tid])
        return tid, hit

    def release_pending(self, rid):
        tid = self._pending_lookups.pop(rid, -1)
        if tid >= 0 and self._sync_ctx.is_sync_leader:
            self.kv_manager.cancel([tid])

    def retrieve_kv(self, rid, slot_mapping):
        tid = self._pending_lookups.pop(rid, -1)
        if tid < 0:
            return 0
        slots = slot_mapping.to("cpu", torch.int64)
        n = slots.numel()
        if self._sync_ctx.is_sync_leader:
            self.kv_manager.launch(task_ids=[tid], slot_mappings=[slots], swa_slot_mappings=[None], as_batch=True)
            if _status(self.kv_manager.wait([tid], timeout=30.0).get(tid)) != "success":
                n = 0
        if self._sync_ctx.needs_sync:
            self._sync_ctx.barrier()
        return n

    def start_load_kv_layerwise(self, rid, slot_mapping):
        raise AssertionError("start_load_kv_layerwise called but layerwise transfer is disabled")

    def drain_launched_loads(self, threshold=100):
        pass

    def store_kv(self, rid, token_ids, kv_indices, sglang_req_id=_UNSET):
        fk.CALLS.append(("store_kv", {"rid": rid, "sglang_req_id": sglang_req_id}))
        ids = np.asarray(token_ids, dtype=np.int64)
        if len(ids) != len(kv_indices):
            raise ValueError(f"store_kv: token_ids has {len(ids)} entries but kv_indices has {len(kv_indices)}")
        aligned = len(ids) // self.page_size * self.page_size
        if aligned == 0:
            return -1
        ids, kv_indices = ids[:aligned], kv_indices[:aligned]
        start = {"rid": rid, "task_id": -1, "active": False, "unmatched_mask": [], "error": ""}
        if self._sync_ctx.is_sync_leader:
            tid, unmatched = self.kv_manager.put_match(token_ids=ids, token_mask=None)
            start.update(task_id=int(tid), unmatched_mask=unmatched.tolist())
            if unmatched.any():
                slots = kv_indices[torch.as_tensor(unmatched)].to("cpu", torch.int64)
                self.kv_manager.launch(task_ids=[tid], slot_mappings=[slots], swa_slot_mappings=[None])
                start["active"] = True
        if self._sync_ctx.needs_sync:
            start = self._sync_ctx.scatter(start, channel="store_start")
        if start["rid"] != rid:
            raise RuntimeError(f"[FlexKV] store-start rid mismatch: local={rid!r}, leader={start['rid']!r}")
        if not start["active"]:
            return -1
        self._inflight_stores[rid] = int(start["task_id"])  # every rank keeps its slots until completion
        return int(start["task_id"])

    def check_completed_stores(self):
        done: list[str] = []
        if self._sync_ctx.is_sync_leader and self._inflight_stores:
            by_tid = {tid: rid for rid, tid in self._inflight_stores.items()}
            responses = self.kv_manager.try_wait(task_ids=list(by_tid))
            done = [by_tid[tid] for tid, r in responses.items() if _status(r) in TERMINAL]
        if self._sync_ctx.needs_sync:
            done = self._sync_ctx.scatter(done, channel="store_completion")
        return [rid for rid in done if self._inflight_stores.pop(rid, None) is not None]

    def wait_store(self, rid, timeout=30.0):
        tid = self._inflight_stores.pop(rid, -1)
        if tid < 0 or not self._sync_ctx.is_sync_leader:
            return True
        return _status(self.kv_manager.wait([tid], timeout=timeout).get(tid)) == "success"

    def prefetch_async(self, rid, token_ids, sglang_req_id=_UNSET):
        return -1  # no SSD/remote tier configured

    def check_prefetch_progress(self, rid):
        return True

    def cancel_prefetch(self, rid):
        self._pending_lookups.pop(rid, None)

    def register_layer_transfer_counter(self, kvcache):
        pass

    def reset(self):
        if self._sync_ctx.is_sync_leader and self._pending_lookups:
            self.kv_manager.cancel(list(self._pending_lookups.values()))
        self._pending_lookups.clear()
        self._inflight_stores.clear()


class Drifted(ServingFlexKVConnector):
    """A future FlexKV whose store_kv renamed its key parameter: must be refused by name."""

    def store_kv(self, request_key, token_ids, kv_indices):  # type: ignore[override]
        raise AssertionError("never bridged")


class FlexKVScatterChannel(str, Enum):
    """FlexKV's scatter channels (comm.py); STORE_START came with the store-ownership fix (#263, 94915c4)."""

    LOOKUP = "lookup"
    STORE_START = "store_start"
    STORE_COMPLETION = "store_completion"


class Pre263Channels(str, Enum):
    LOOKUP = "lookup"
    STORE_COMPLETION = "store_completion"


# tree name -> (FlexKV's own connector [module.]class, its scatter channels)
TREES = {
    "serving": ("ServingFlexKVConnector", "FlexKVScatterChannel"),
    "prefetch": ("flexkv_prefetch.PrefetchFlexKVConnector", "FlexKVScatterChannel"),
    "drifted": ("Drifted", "FlexKVScatterChannel"),
    "pre263": ("ServingFlexKVConnector", "Pre263Channels"),
}


def build_serving_tree(root: Path, shape: str = "serving") -> Path:
    """The ``current`` stand-in tree, with FlexKV's own connector and comm module taken from this module."""
    connector, channels = TREES[shape]
    module, _, connector = connector.rpartition(".")
    fk.build_tree(root, "current")
    sglang = root / "flexkv/integration/sglang"
    (sglang / "connector.py").write_text(
        f"from tests.sglang.{module or 'flexkv_serving'} import {connector} as FlexKVConnector\n"
    )
    (sglang / "comm.py").write_text(f"from tests.sglang.flexkv_serving import {channels} as FlexKVScatterChannel\n")
    return root
