"""One TP rank of SGLang's real FlexKVRadixCache behind the bridge (spawned process, real gloo group)."""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing  # registers the reducers that pass shared-memory tensors by handle)

IDS = list(range(1000, 1048))


def _poll_until_done(rig: Any, limit: int = 4) -> int:
    """Scheduler ticks on every rank (check_completed_stores is a collective) until no store is in flight."""
    for tick in range(limit):
        if not rig.cache._inflight_store_nodes:
            return tick
        rig.cache.check_hicache_events()
    return limit


def _hand_over_registration(rank: int, registrations: Any, broken: bool) -> None:
    """What KVTPClient does over its IPC socket: every rank's registered tensors reach the leader's data plane.

    ``broken`` shifts a layer in rank 1's registration only (layer 0's slot points at layer 1): the negative control.
    """
    from . import flexkv_serving as serving
    from . import flexkv_standin as fk

    if rank != 0:
        tensors = list(fk.calls("register_to_server")[-1]["kv_caches"])
        if broken:
            tensors[0] = tensors[1]
        registrations.put((rank, tensors))
        return
    peer, tensors = registrations.get(timeout=60)
    serving.PEER_REGISTRATIONS[peer] = tensors


def _forward(rig: Any, group: Any, rid: str, ids: list[int], seed: int, attempt: int = 0) -> Any:
    """A request whose KV a forward pass wrote: the model's collectives end it on every rank together.

    Without this barrier the leader, whose scatters do not wait, could copy a rank's slots before that
    rank wrote them, which no real forward pass allows."""
    req = rig.request(rid, ids, prompt=40, seed=seed, attempt=attempt)
    dist.barrier(group=group)
    return req


def _abort_after_store(rig: Any, group: Any, rank: int) -> dict[str, Any]:
    """SGLang's PD transfer failure on every rank: checkpoint (FlexKV's store starts), then finish(ABORT)."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    from .radix_harness import read, retake, zero

    ids = list(range(3000, 3048))
    req = _forward(rig, group, "r3", ids, seed=30 + rank)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
    out = {"abort evicted in flight": rig.evict_all(), "abort ticks": _poll_until_done(rig)}
    out["abort evicted"] = rig.evict_all()
    zero(rig.pool, req.slots)
    taken = retake(rig.alloc, req.slots)
    loaded, slots = rig.match_and_load(rig.request("r4", ids, prompt=40, allocate=False))
    out["abort restored"] = (loaded, slots is not None and read(rig.pool, slots) == expected)
    rig.alloc.free(torch.tensor(sorted(taken)))
    return out


def _reuse_rid(rig: Any, group: Any, rank: int) -> dict[str, Any]:
    """The same rid at attempt 0 again while its first store runs, on every rank (SGLang allows it,
    tokenizer_manager.py:3833-3837): the bridge's store keys must agree across ranks (FlexKV's leader compares
    them, connector.py:1146) and each store must unlock its own node."""
    rig.evict_all()
    for ids, seed in ((list(range(4000, 4048)), 40), (list(range(4100, 4148)), 50)):
        rig.finish(_forward(rig, group, "r5", ids, seed=seed + rank))
    out: dict[str, Any] = {"reuse keys": sorted(rig.cache.flexkv_connector.connector._inflight_stores)}
    out["reuse ticks"] = _poll_until_done(rig)
    out["reuse locked"] = rig.cache.protected_size()
    out["reuse evicted"] = rig.evict_all()
    return out


def scenario(rank: int, config_dir: str, registrations: Any, real: str = "", broken: bool = False) -> dict[str, Any]:
    import pytest
    from sglang.srt import plugins
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import get_parallel

    from .radix_harness import Rig, buffers, make_pool, read, retake, untouched_outside, zero

    get_parallel().override_permanently(world_group=SimpleNamespace(cpu_group=None), attn_dcp_size=1)
    os.environ["SGLANG_PLUGINS"] = "flexkv_adapter"
    HookRegistry.reset()
    plugins._plugins_loaded = False  # a forked rank loads the plugin itself, as every SGLang process does
    monkeypatch = pytest.MonkeyPatch()
    if real:
        from .real_flexkv import prepare, replace_gpu_parts

        prepare(monkeypatch, real)
    plugins.load_plugins()
    if real:
        replace_gpu_parts(monkeypatch)
    group = dist.new_group([0, 1], backend="gloo")
    pool = make_pool("mha", heads=2)  # this rank's head shard
    for t in [*pool.k_buffer, *pool.v_buffer]:
        t.share_memory_()  # before registration: the leader's data plane reads and writes it (as CUDA IPC)
    rig = Rig(monkeypatch, ModelConfig(model_path=config_dir), "mha", tp_size=2, tp_rank=rank, group=group, pool=pool)
    _hand_over_registration(rank, registrations, broken)
    connector = rig.cache.flexkv_connector.connector
    out: dict[str, Any] = {"leader": connector._sync_ctx.is_sync_leader, "file": inspect.getfile(type(connector))}

    first = _forward(rig, group, "r1", IDS, seed=10 + rank)
    expected = read(rig.pool, first.slots)
    rig.finish(first)
    retry = _forward(rig, group, "r1", IDS[:32] + list(range(2000, 2016)), seed=20 + rank, attempt=1)
    rig.finish(retry)
    out["stored"] = sorted(h.attempt_id for h in rig.cache._inflight_store_nodes)  # store_kv returned >= 0
    out["keys"] = sorted(rig.cache.flexkv_connector.connector._inflight_stores)  # FlexKV's own bookkeeping
    out["evicted_in_flight"] = rig.evict_all()  # polls once: still running, every rank keeps its slots
    out["ticks"] = _poll_until_done(rig)
    out["evicted"] = rig.evict_all()
    zero(rig.pool, first.slots)
    taken = retake(rig.alloc, first.slots)  # the restore must go elsewhere
    before = [t.clone() for t in buffers(rig.pool)]
    loaded, slots = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    out["loaded"] = loaded
    out["elsewhere"] = slots is not None and not set(slots.tolist()) & set(first.slots.tolist())
    out["exact"] = slots is not None and read(rig.pool, slots) == expected  # through SGLang's getters, every layer
    out["untouched"] = slots is not None and untouched_outside(before, rig.pool, slots)
    rig.alloc.free(torch.tensor(sorted(taken)))
    rig.evict_all()
    out.update(_abort_after_store(rig, group, rank))
    out.update(_reuse_rid(rig, group, rank))

    # Keys that differ across ranks (a key of something rank-local) are refused by FlexKV: ours never differ.
    # The bridge raises it as an AdapterError on the rank that differs (the others' FlexKV copies its slots).
    try:
        rig.cache.flexkv_connector.store_kv(
            handle=CacheRequestHandle("x", rank), token_ids=IDS[:16], kv_indices=rig.alloc.alloc(16).int()
        )
        out["mismatch"] = "none"
    except ValueError as exc:  # AdapterError
        out["mismatch"] = str(exc)
    dist.barrier()  # FlexKV's leader sends without waiting: stay until every rank has read
    monkeypatch.undo()
    return out


def run(rank: int, rendezvous: str, tree: str, config_dir: str, queue: Any, registrations: Any, real: str = "",
        broken: bool = False) -> None:  # fmt: skip
    torch.set_num_threads(1)  # forked from a process whose OpenMP pool may be running: a parallel op would hang
    if not real:
        sys.path.insert(0, tree)
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        queue.put((rank, "ok", scenario(rank, config_dir, registrations, real, broken)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()
