"""A request id used again while its first store still runs keeps no lock forever.

SGLang 0.5.23 allows a finished request's rid again at attempt 0 (tokenizer_manager.py:3833-3837). Both
stores shared FlexKV's key (``_inflight_stores[rid]``, connector.py:1180) and SGLang's
``_inflight_store_nodes[handle]`` (flexkv_radix_cache.py:440-441): the first store's 48 tokens stayed
locked for the life of the server.
"""

from __future__ import annotations

import torch

from . import flexkv_faults
from .radix_harness import Rig, read, retake, zero

faulty = flexkv_faults.faulty  # the fixture
FIRST, SECOND = list(range(1000, 1048)), list(range(5000, 5048))


def _reused(rig: Rig) -> dict:
    first = rig.request("r1", FIRST, prompt=40, seed=7)
    expected = read(rig.pool, first.slots)
    rig.finish(first)  # FlexKV's store of it starts
    rig.finish(rig.request("r1", SECOND, prompt=40, seed=8))  # the same rid, attempt 0, while it runs
    keys = sorted(rig.cache.flexkv_connector.connector._inflight_stores)
    for _ in range(4):
        rig.cache.check_hicache_events()
    out = {"keys": keys, "locked": rig.cache.protected_size(), "evicted": rig.evict_all(), "restored": False}
    if out["locked"]:
        return out  # the first request's slots are still held: nothing to restore into elsewhere
    zero(rig.pool, first.slots)
    taken = retake(rig.alloc, first.slots)
    loaded, slots = rig.match_and_load(rig.request("r2", FIRST, prompt=40, allocate=False))
    out["restored"] = loaded == len(FIRST) and slots is not None and read(rig.pool, slots) == expected
    rig.alloc.free(torch.tensor(sorted(taken)))
    return out


def test_two_stores_under_one_rid_each_unlock_their_own_node(faulty, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    out = _reused(rig)
    assert len(out["keys"]) == 2 and out["keys"][0] == "r1@attempt0"  # unique per store, the first as before
    assert out["locked"] == 0 and out["evicted"] == len(FIRST) + len(SECOND)
    assert out["restored"]


def test_negative_control_one_key_per_rid_leaks_the_first_lock(faulty, models, monkeypatch):
    from flexkv_adapter.integrations.sglang.stores import StoreKeys

    monkeypatch.setattr(StoreKeys, "key", lambda self, base: base)
    rig = Rig(monkeypatch, models["llama"], "mha")
    out = _reused(rig)
    assert out["keys"] == ["r1@attempt0"] and out["locked"] == len(FIRST)
