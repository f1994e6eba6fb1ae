"""Abort sequences through the bridge's abort hook: a second abort of the same
request, an abort of a request that stored nothing, and an abort whose store FlexKV reports as failed."""

from __future__ import annotations

from .radix_harness import Rig, read, retake, zero
from .test_sglang_bridge_abort import IDS


def _rig(sglang_env, models, monkeypatch) -> Rig:
    sglang_env.use("serving")
    sglang_env.load()
    return Rig(monkeypatch, models["llama"], "mha")


def test_a_second_abort_of_the_same_request_keeps_the_lock_until_the_store_completes(sglang_env, models, monkeypatch):
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    rig = _rig(sglang_env, models, monkeypatch)
    req = rig.request("r1", IDS, prompt=40, seed=7)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    for _ in range(2):
        rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
    assert rig.evict_all() == 0  # still copying
    for _ in range(3):
        rig.cache.check_hicache_events()
    assert rig.evict_all() == len(IDS) and rig.cache.protected_size() == 0  # released once, not held forever
    zero(rig.pool, req.slots)
    retake(rig.alloc, req.slots)
    loaded, slots = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and slots is not None and read(rig.pool, slots) == expected


def test_an_abort_of_a_request_that_stored_nothing_locks_nothing(sglang_env, models, monkeypatch):
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    rig = _rig(sglang_env, models, monkeypatch)
    req = rig.request("r1", IDS, prompt=40, seed=7)
    rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)  # before any checkpoint
    assert not rig.cache._inflight_store_nodes and rig.cache.protected_size() == 0
