"""Hypothesis sequences of store / poll / evict / match+load / retry through SGLang 0.5.23's real
FlexKVRadixCache, the bridge and the FlexKV 34ab141 stand-in.

Invariants: every restore is byte-exact for the prompt it names (read through the pool's getters);
after the last polls no store is in flight on either side, no lookup is held, no node stays locked
and every slot goes back to the allocator. rids contain ``@attempt`` on purpose (key parsing).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from .radix_harness import Rig, read
from .real_flexkv import needs_flexkv
from .test_sglang_bridge_real import real_flexkv  # noqa: F401 (a fixture)

PROMPTS = [list(range(1000 + 100 * p, 1048 + 100 * p)) for p in range(3)]  # no shared prefixes: one seed each
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("abort"), st.integers(0, 2), st.booleans()),  # stored, then aborted (PD transfer failure)
        st.tuples(st.just("poll"), st.just(0), st.just(False)),
        st.tuples(st.just("evict"), st.just(0), st.just(False)),
        st.tuples(st.just("load"), st.integers(0, 2), st.just(False)),
    ),
    max_size=12,
)


def _on_device(rig: Rig, ids: list[int]) -> int:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return int(rig.cache.match_prefix(MatchPrefixParams(key=RadixKey(ids, None))).device_prefix_len)


def _sequences(models, monkeypatch, kind):
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    seen = {"loads": 0}

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    @given(ops=OPS)
    @example(ops=[("store", 0, False), ("poll", 0, False), ("poll", 0, False), ("evict", 0, False), ("load", 0, False)])
    @example(ops=[("store", 1, True), ("store", 2, False), ("evict", 0, False), ("poll", 0, False), ("evict", 0, False),
                  ("load", 1, False), ("evict", 0, False), ("store", 1, True), ("load", 2, False)])  # fmt: skip
    @example(ops=[("abort", 0, False), ("evict", 0, False), ("store", 1, False), ("poll", 0, False),
                  ("poll", 0, False), ("evict", 0, False), ("load", 0, False)])  # fmt: skip
    def run(ops):
        rig = Rig(monkeypatch, models["llama" if kind == "mha" else "deepseek"], kind)
        expected: dict[int, list[bytes]] = {}
        attempts: dict[int, int] = {}
        for op, p, retry in ops:
            ids = PROMPTS[p]
            if op in ("store", "abort") and _on_device(rig, ids) == 0 and rig.alloc.available_size() >= len(ids):
                attempt = attempts.get(p, -1) + 1 if retry else 0
                attempts[p] = attempt
                req = rig.request(f"r{p}@attempt9", ids, prompt=40, attempt=attempt, seed=p)
                expected[p] = read(rig.pool, req.slots)
                rig.finish(req)
                if op == "abort":
                    rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
            elif op == "poll":
                rig.cache.check_hicache_events()
            elif op == "evict":
                rig.evict_all()
            elif op == "load" and _on_device(rig, ids) == 0:
                loaded, slots = rig.match_and_load(rig.request(f"l{p}", ids, prompt=40, allocate=False))
                if slots is not None:
                    seen["loads"] += 1
                    assert read(rig.pool, slots) == [b[: len(b) * loaded // len(ids)] for b in expected[p]]
        for _ in range(2):
            rig.cache.check_hicache_events()
        conn = rig.cache.flexkv_connector.connector
        assert not rig.cache._inflight_store_nodes and not conn._inflight_stores and not conn._pending_lookups
        assert rig.cache.protected_size() == 0
        rig.evict_all()
        assert rig.alloc.available_size() == rig.pool.size // 16 * 16

    run()
    return seen


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_sequences_restore_exact_bytes_and_release_everything(sglang_env, models, monkeypatch, kind):
    sglang_env.use("serving")
    sglang_env.load()
    assert _sequences(models, monkeypatch, kind)["loads"] > 0


@needs_flexkv
@pytest.mark.usefixtures("real_flexkv")
def test_sequences_through_flexkv_real_connector(models, monkeypatch):
    assert _sequences(models, monkeypatch, "mha")["loads"] > 0


def test_negative_control_keys_parsed_from_the_left_lose_completions(sglang_env, models, monkeypatch):
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector

    def first_split(self, key):  # broken on purpose: "r0@attempt9@attempt0" -> rid "r0"
        rid, _, rest = key.partition("@attempt")
        return CacheRequestHandle(rid=rid, attempt_id=int(rest.rpartition("@attempt")[2]))

    from flexkv_adapter.integrations.sglang.stores import StoreKeys

    monkeypatch.setattr(BridgeConnector, "_handle", first_split)
    monkeypatch.setattr(StoreKeys, "completed", lambda self, key: None)  # every completion parsed from its key
    monkeypatch.setattr(StoreKeys, "take", lambda self, keys: [None] * len(keys))  # (the poll's, for all its keys)
    sglang_env.use("serving")
    sglang_env.load()
    with pytest.raises(AssertionError):
        _sequences(models, monkeypatch, "mha")
