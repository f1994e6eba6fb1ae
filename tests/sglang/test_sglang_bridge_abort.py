"""A request aborted after its FlexKV store started (SGLang 0.5.23, PD prefill transfer failure).

``handle_inflight_transfer_failure`` (disaggregation/prefill.py:1305-1306) checkpoints the finished
request, which starts FlexKV's store of its slots and locks the radix node until the store completes,
then aborts it: ``finish(handle, ABORT)`` -> ``FlexKVRadixCache.release_aborted_request``
(storage/flexkv/flexkv_radix_cache.py:481-489) drops that lock at once. The slots can then be evicted
and handed to another request while FlexKV's host copy still reads them.
"""

from __future__ import annotations

import pytest

from .radix_harness import Rig, read, retake, zero
from .real_flexkv import SKIP_REASON, SOURCE
from .test_sglang_bridge_real import real_flexkv  # noqa: F401 (a fixture)

IDS = list(range(1000, 1048))


def _aborted_after_store(rig: Rig) -> tuple[list[bytes], int, int, bool]:
    """Store, abort, evict, reuse the slots, complete, restore: (expected, evicted in flight, loaded, exact)."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    req = rig.request("r1", IDS, prompt=40, seed=7)
    expected = read(rig.pool, req.slots)
    rig.finish(req)  # release_kv_cache(req, checkpoint=True): FlexKV's store of these slots starts
    rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)  # then the transfer-failure abort
    evicted = rig.evict_all()  # one completion poll: FlexKV's host copy still runs
    other = rig.request("r9", list(range(5000, 5048)), prompt=40, seed=99)  # whatever slots are free now
    rig.finish(other)
    for _ in range(3):
        rig.cache.check_hicache_events()  # the host copies run, the completions come back
    rig.evict_all()
    zero(rig.pool, req.slots)
    retake(rig.alloc, req.slots)
    loaded, slots = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert not rig.cache._inflight_store_nodes and rig.cache.protected_size() == 0  # nothing stays locked
    return expected, evicted, loaded, slots is not None and read(rig.pool, slots) == expected


@pytest.fixture(params=["standin", "real"])
def rig(request, sglang_env, models, monkeypatch):
    if request.param == "real":
        if not SOURCE:
            pytest.skip(SKIP_REASON)
        request.getfixturevalue("real_flexkv")
    else:
        sglang_env.use("serving")
        sglang_env.load()
    return Rig(monkeypatch, models["llama"], "mha")


def test_an_abort_keeps_the_stored_slots_until_flexkv_has_copied_them(rig):
    _, evicted, loaded, exact = _aborted_after_store(rig)
    assert evicted == 0  # the store still reads them: not evictable
    assert loaded == len(IDS) and exact  # FlexKV holds the request's bytes, not another request's
