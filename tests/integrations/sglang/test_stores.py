"""StoreKeys (the SGLang bridge's per-store keys): under any order of stores and completions, with rids
used again, every store has its own FlexKV key and every completion unlocks exactly its own node."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.integrations.sglang.bridge import handle_key
from flexkv_adapter.integrations.sglang.stores import StoreKeys


@dataclass(frozen=True)
class Handle:  # SGLang's CacheRequestHandle: a frozen dataclass of rid and attempt_id
    rid: str
    attempt_id: int


# ("store", rid index, attempt) or ("complete", index into the stores in flight)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("complete"), st.integers(0, 50)),
    ),
    max_size=40,
)


@given(STEPS, st.sampled_from(["r", "r@attempt0", "r#store1", "", "\x00"]))
def test_every_completion_unlocks_its_own_node(steps, rid):
    keys = StoreKeys()
    radix = SimpleNamespace(_inflight_store_nodes={}, _node_lock=threading.Lock())
    inflight: list[tuple[str, object]] = []  # (FlexKV key, the node its store locked)
    for step in steps:
        if step[0] == "store":
            handle = Handle(f"{rid}{step[1]}", step[2])
            key = keys.key(handle_key(handle))
            assert key not in [k for k, _ in inflight]  # FlexKV's _inflight_stores never overwritten
            node = object()
            keys.started(handle, key, radix, handle_key(handle))
            radix._inflight_store_nodes[handle] = node  # what SGLang's checkpoint does next (:440-441)
            inflight.append((key, node))
        elif inflight:
            key, node = inflight.pop(step[1] % len(inflight))
            handle = keys.completed(key)
            assert radix._inflight_store_nodes.pop(handle) is node  # SGLang's _drain_completed_stores
    for key, node in inflight:
        assert radix._inflight_store_nodes.pop(keys.completed(key)) is node
    assert not radix._inflight_store_nodes and not keys and not keys.latest and not keys.bases


def test_negative_control_without_moving_the_earlier_lock_the_first_completion_unlocks_the_second_node():
    class Unmoved(StoreKeys):
        def started(self, handle, key, radix, base):  # broken on purpose: the earlier lock stays under the handle
            super().started(handle, key, None, base)

    keys, handle = Unmoved(), Handle("r", 0)
    radix = SimpleNamespace(_inflight_store_nodes={}, _node_lock=threading.Lock())
    first, second = object(), object()
    for node in (first, second):
        key = keys.key(handle_key(handle))
        keys.started(handle, key, radix, handle_key(handle))
        radix._inflight_store_nodes[handle] = node
    assert radix._inflight_store_nodes.get(keys.completed("r@attempt0")) is second  # the wrong node: first leaks
