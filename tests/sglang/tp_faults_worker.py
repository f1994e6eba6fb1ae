"""One TP rank of SGLang's real FlexKVRadixCache over FlexKV's real connector, with the leader's copy failing."""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .tp_worker import IDS, _forward, _hand_over_registration, _poll_until_done


def _setup(rank: int, config_dir: str, registrations: Any, source: str, control: bool) -> tuple[Any, Any, Any]:
    from types import SimpleNamespace

    import pytest
    from sglang.srt import plugins
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import get_parallel

    from .flexkv_faults import use_faulty_manager
    from .radix_harness import Rig, make_pool
    from .real_flexkv import prepare, replace_gpu_parts

    get_parallel().override_permanently(world_group=SimpleNamespace(cpu_group=None), attn_dcp_size=1)
    os.environ["SGLANG_PLUGINS"] = "flexkv_adapter"
    HookRegistry.reset()
    plugins._plugins_loaded = False
    monkeypatch = pytest.MonkeyPatch()
    prepare(monkeypatch, source)
    plugins.load_plugins()
    replace_gpu_parts(monkeypatch)
    use_faulty_manager(monkeypatch)
    if control:  # broken on purpose: every rank keeps its own answer
        from flexkv_adapter.integrations.sglang.outcomes import Agreement

        monkeypatch.setattr(Agreement, "min", lambda self, values: list(values))
    group = dist.new_group([0, 1], backend="gloo")
    pool = make_pool("mha", heads=2)
    for t in [*pool.k_buffer, *pool.v_buffer]:
        t.share_memory_()
    rig = Rig(monkeypatch, ModelConfig(model_path=config_dir), "mha", tp_size=2, tp_rank=rank, group=group, pool=pool)
    _hand_over_registration(rank, registrations, False)
    return rig, group, monkeypatch


def _raise_once(connector: Any, name: str) -> None:
    """FlexKV's ``name`` on this rank raises once, as a CUDA error surfacing at a device-to-host copy would."""

    def raising(*args: Any, **kwargs: Any) -> Any:
        delattr(connector, name)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    setattr(connector, name, raising)


def scenario(rank: int, config_dir: str, registrations: Any, source: str, mode: str, control: bool) -> dict[str, Any]:
    from .flexkv_faults import FAULTS, manager
    from .radix_harness import read, zero

    rig, group, monkeypatch = _setup(rank, config_dir, registrations, source, control)
    first = _forward(rig, group, "r1", IDS, seed=10 + rank)
    expected = read(rig.pool, first.slots)
    rig.finish(first)
    _poll_until_done(rig)
    rig.evict_all()
    zero(rig.pool, first.slots)
    free = rig.alloc.available_size()
    r2 = rig.request("r2", IDS, prompt=40, allocate=False)
    if mode == "lookup":  # a repeated match: FlexKV's leader cancels the held task after its scatter, and raises
        rig.match(r2)
        FAULTS.cancel = "raise"
    elif mode == "peer raise":  # rank 1's FlexKV raises before the barrier its leader waits in (connector.py:624, :693)
        if rank == 1:
            _raise_once(rig.cache.flexkv_connector.connector, "_to_cpu_int64")
    else:
        FAULTS.get, FAULTS.delay = mode, 2
    loaded, _ = rig.match_and_load(r2)
    FAULTS.get = FAULTS.cancel = ""
    out: dict[str, Any] = {
        "loaded": loaded,
        "tree": rig.cache.evictable_size(),
        "held": free - rig.alloc.available_size(),
    }
    if control:  # the trees diverged: the next collective (a completion poll) would pair up wrong calls
        dist.barrier()
        monkeypatch.undo()
        return out
    if rank == 0:
        manager(rig).advance(2)  # a late copy lands
    for _ in range(2):
        rig.cache.check_hicache_events()
    out["held after"] = free - rig.alloc.available_size() - rig.cache.evictable_size()
    if out["tree"]:
        rig.evict_all()
    loaded, slots = rig.match_and_load(rig.request("r3", IDS, prompt=40, allocate=False))
    out["again"] = (loaded, slots is not None and read(rig.pool, slots) == expected)
    dist.barrier()
    monkeypatch.undo()
    return out


def flush_scenario(rank: int, config_dir: str, registrations: Any, source: str, mode: str, control: bool
                   ) -> dict[str, Any]:  # fmt: skip
    """A flush on every rank (SGLang's flush_cache runs on each): the leader's KVManager.reset succeeds
    (``flush``) or raises (``flush failed``); every rank takes the leader's outcome."""
    from .flexkv_faults import FAULTS

    rig, group, monkeypatch = _setup(rank, config_dir, registrations, source, control)
    first = _forward(rig, group, "r1", IDS, seed=10 + rank)
    rig.finish(first)
    _poll_until_done(rig)
    rig.evict_all()
    FAULTS.reset = "raise" if mode == "flush failed" else ""
    rig.cache.reset()  # no scheduler hook in these processes: SGLang's flush goes on after the bridge's
    FAULTS.reset = ""
    bridge = rig.cache.flexkv_connector
    if control:  # the ranks disagree: the next FlexKV collective would pair up different calls
        dist.barrier()
        monkeypatch.undo()
        return {"stale": bridge.stale}
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    out: dict[str, Any] = {"stale": bridge.stale, "loaded": loaded}
    rig.cache.reset()  # a flush that succeeds ends the bypass on every rank
    rig.finish(_forward(rig, group, "r3", IDS, seed=20 + rank))  # the new weights' KV
    _poll_until_done(rig)
    rig.evict_all()
    out["after"] = (bridge.stale, rig.match_and_load(rig.request("r4", IDS, prompt=40, allocate=False))[0])
    dist.barrier()
    monkeypatch.undo()
    return out


def store_scenario(rank: int, config_dir: str, registrations: Any, source: str, mode: str, control: bool
                   ) -> dict[str, Any]:  # fmt: skip
    """The leader's store launch raises (FlexKV scatters the error, connector.py:1108-1153, and every rank
    raises it): every rank unlocks the node, FlexKV's put task is cancelled, the prefix is stored again later."""
    from .flexkv_faults import FAULTS
    from .radix_harness import read, zero

    rig, group, monkeypatch = _setup(rank, config_dir, registrations, source, control)
    FAULTS.put = "raise"
    first = _forward(rig, group, "r1", IDS, seed=10 + rank)
    expected = read(rig.pool, first.slots)  # the device tree keeps this KV for the prefix
    rig.finish(first)  # raised out of checkpoint before the fix
    FAULTS.put = ""
    out: dict[str, Any] = {"locked": rig.cache.protected_size(), "in flight": len(rig.cache._inflight_store_nodes)}
    rig.finish(_forward(rig, group, "r2", IDS, seed=20 + rank))  # the same prefix again: the tree's KV is stored
    _poll_until_done(rig)
    rig.evict_all()
    zero(rig.pool, first.slots)
    loaded, slots = rig.match_and_load(rig.request("r3", IDS, prompt=40, allocate=False))
    out["again"] = (loaded, slots is not None and read(rig.pool, slots) == expected)
    dist.barrier()
    monkeypatch.undo()
    return out


def run(rank: int, rendezvous: str, config_dir: str, queue: Any, registrations: Any, source: str, mode: str,
        control: bool) -> None:  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        play = {"flush": flush_scenario, "store": store_scenario}.get(mode.split()[0], scenario)
        queue.put((rank, "ok", play(rank, config_dir, registrations, source, mode, control)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()
