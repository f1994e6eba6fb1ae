"""The SGLang bridge's pure parts: handle keys, FlexKV connector shape checks, refusals, namespaces."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError
from flexkv_adapter.integrations.sglang.bridge import BridgeConnector, check_connector, handle_key
from flexkv_adapter.integrations.sglang.refusals import own_connector_refusal, start_refusal


@dataclass(frozen=True)
class Handle:  # SGLang's CacheRequestHandle: a frozen dataclass of rid and attempt_id
    rid: str
    attempt_id: int


@given(st.text(), st.integers(0, 2**31), st.text(), st.integers(0, 2**31))
def test_keys_are_deterministic_and_injective(rid_a, att_a, rid_b, att_b):
    a, b = Handle(rid_a, att_a), Handle(rid_b, att_b)
    assert handle_key(a) == handle_key(Handle(rid_a, att_a))
    assert (handle_key(a) == handle_key(b)) == (a == b)


@given(st.text(), st.integers(0, 2**31))
def test_completed_keys_map_back_to_equal_handles(rid, attempt):
    from flexkv_adapter.integrations.sglang.outcomes import Agreement, Quarantine
    from flexkv_adapter.integrations.sglang.stores import StoreKeys

    bridge = BridgeConnector.__new__(BridgeConnector)
    bridge._handle_type, bridge.observed, bridge.leader, bridge._log = Handle, None, True, []
    bridge.stores, bridge.quarantine = StoreKeys(), Quarantine(Agreement(None, False))
    bridge.connector = SimpleNamespace(
        check_completed_stores=lambda: [handle_key(Handle(rid, attempt)), handle_key(Handle(rid, attempt)) + "#store7"]
    )
    assert bridge.check_completed_stores() == [Handle(rid, attempt)] * 2  # a key this bridge did not make: parsed


class Good:
    def __init__(self, *, sgl_model_config, server_args, page_size, kvcache, tp_rank, dp_rank, pp_rank,
                 attn_cp_rank, pp_group=None, attn_tp_group=None, attn_cp_group=None): ...  # fmt: skip
    def lookup_kv(self, token_ids, token_mask, rid=None, sglang_req_id=None): ...
    def store_kv(self, rid, token_ids, kv_indices, sglang_req_id=None): ...
    def retrieve_kv(self, rid, slot_mapping): ...
    def start_load_kv_layerwise(self, rid, slot_mapping): ...
    def release_pending(self, rid): ...
    def prefetch_async(self, rid, token_ids, sglang_req_id=None): ...
    def check_prefetch_progress(self, rid): ...
    def cancel_prefetch(self, rid): ...
    def check_completed_stores(self): ...
    def drain_launched_loads(self, threshold=100): ...
    def register_layer_transfer_counter(self, kvcache): ...
    def reset(self): ...
    def shutdown(self): ...


def test_a_connector_with_flexkv_34ab141_signatures_is_accepted():
    assert check_connector(Good).takes_req_id == {"lookup_kv", "store_kv", "prefetch_async"}


class NoRetrieve(Good):
    retrieve_kv = None  # type: ignore[assignment]


class HandleKeyword(Good):
    def lookup_kv(self, token_ids, token_mask, handle=None): ...


class NewRequired(Good):
    def store_kv(self, rid, token_ids, kv_indices, namespace): ...


class NarrowInit(Good):
    def __init__(self, *, sgl_model_config, server_args, page_size, kvcache): ...


class WiderInit(Good):
    def __init__(self, *, sgl_model_config, server_args, page_size, kvcache, tp_rank, dp_rank, pp_rank,
                 attn_cp_rank, world_group, pp_group=None, attn_tp_group=None, attn_cp_group=None): ...  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (WiderInit, r"__init__\(\) requires \['world_group'\]"),
        (NoRetrieve, r"retrieve_kv\(\) is missing"),
        (HandleKeyword, r"lookup_kv\(\) takes \(token_ids, token_mask, handle\)"),
        (NewRequired, r"store_kv\(\) requires \['namespace'\]"),
        (NarrowInit, r"__init__\(\) does not take \['tp_rank'"),
    ],
)
def test_a_changed_connector_is_refused_naming_the_method(cls, match):
    with pytest.raises(AdapterError, match=match):
        check_connector(cls)


def test_indexer_pools_and_dcp_are_refused_for_flexkv_own_connector():
    pool = SimpleNamespace(index_k_with_scale_buffer=[object()])
    assert "index_k_with_scale_buffer" in str(own_connector_refusal(pool))
    assert "index_k_with_scale_buffer" in str(own_connector_refusal(SimpleNamespace(source=pool)))
    assert own_connector_refusal(SimpleNamespace(k_buffer=[])) is None
    assert "dcp_size=2" in str(start_refusal(SimpleNamespace(), SimpleNamespace(dcp_size=2)))
    assert start_refusal(SimpleNamespace(k_buffer=[]), SimpleNamespace(dcp_size=1)) is None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"pp_size": 2}, "pp_size=2: --pp-size"),
        ({"attn_cp_size": 2}, "attn_cp_size=2: --attn-cp-size"),
        ({"enable_dp_attention": True, "dp_size": 2}, "dp_rank=None"),
        # DP replicas: the factory passes dp_rank=None to each, so both would be FlexKV's DP client 0
        # (FlexKV: dp_client_id = instance_id * dp_size + dp_rank)
        ({"enable_dp_attention": False, "dp_size": 2, "tp_size": 2}, "dp_rank=None"),
        ({"attn_dp_size": 2, "tp_size": 2}, "attn_dp_size=2"),  # SGLang 0.5.23's spelling of DP attention
        ({"enable_kv_cache_sharding": True}, "enable_kv_cache_sharding"),
        ({"tp_size": 2}, None),
        ({}, None),
    ],
)
def test_the_bridge_serves_tensor_parallelism_only(args, match):
    refusal = start_refusal(None, SimpleNamespace(**args))
    assert (refusal is None) if match is None else (match in str(refusal))


@pytest.mark.parametrize(("backend", "refused"), [(None, False), ("", False), ("file", True), ("mooncake", True)])
def test_a_hicache_storage_backend_is_refused_under_the_bridge(backend, refused):
    refusal = start_refusal(None, SimpleNamespace(hicache_storage_backend=backend))
    assert (refusal is not None) == refused and start_refusal(None, SimpleNamespace()) is None
    assert refusal is None or ("is_backuped" in str(refusal) and repr(backend) in str(refusal))


class _Response:
    def __init__(self, status: str) -> None:
        self.status = status


class _Manager:
    """The leader's KVManager for one load: launch returns, wait answers ``status``; cancel is recorded."""

    def __init__(self, status: str) -> None:
        self.status, self.cancelled = status, []

    def launch(self, task_ids, slot_mappings, **kwargs):
        return task_ids

    def wait(self, task_ids, timeout=20.0, completely=False):
        return {t: _Response(self.status) for t in task_ids}

    def cancel(self, task_ids):
        self.cancelled += task_ids


@given(st.sampled_from(["success", "failed", "timeout", "cancelled"]), st.integers(0, 3), st.integers(1, 3))
def test_a_load_counts_only_when_its_own_wait_said_success_and_every_slot_came_back(status, returned, count):
    """At TP 1 on the leader: FlexKV's connector launches and waits through the recorder, then answers a count;
    the bridge returns the count only for a success of every slot, quarantines a copy past its deadline (not
    ended) and frees the rest, whatever count the connector claims."""
    import torch

    from flexkv_adapter.integrations.sglang.outcomes import Agreement, ObservedManager, Quarantine

    manager = _Manager(status)
    bridge = BridgeConnector.__new__(BridgeConnector)
    bridge.leader, bridge.agreement = True, Agreement(None, False)
    bridge.observed, bridge.quarantine = ObservedManager(manager), Quarantine(Agreement(None, False))
    observed = bridge.observed
    bridge._log = observed.log

    def retrieve_kv(key, slot_mapping):
        observed.launch(task_ids=[5], slot_mappings=[slot_mapping])
        observed.wait([5], timeout=30.0)
        return returned

    bridge.connector = SimpleNamespace(_pending_lookups={handle_key(Handle("r", 0)): 5}, retrieve_kv=retrieve_kv)
    got = bridge.retrieve_kv(Handle("r", 0), torch.arange(count))
    assert got == (count if status == "success" and returned == count else 0)
    assert len(bridge.quarantine) == (status == "timeout")
    assert manager.cancelled == []  # launched: never cancelled (FlexKV would forget a running copy)


class _Matcher(_Manager):
    """A KVManager whose get_match hands out task ids 1, 2, ... (each a held match)."""

    def __init__(self) -> None:
        super().__init__("success")
        self.next_id = 0

    def get_match(self, **kwargs):
        self.next_id += 1
        return self.next_id, None


@given(st.integers(0, 4), st.booleans())
def test_a_failed_lookup_cancels_only_the_tasks_its_own_call_created(earlier, poll_between):
    """Earlier lookups' held matches (other requests' loads to come) survive a later lookup's failure: the record
    a failure reads starts afresh with each call, and a store poll between calls does not change that."""
    from flexkv_adapter.integrations.sglang.outcomes import Agreement, ObservedManager, Quarantine
    from flexkv_adapter.integrations.sglang.stores import StoreKeys

    manager = _Matcher()
    bridge = BridgeConnector.__new__(BridgeConnector)
    bridge.leader, bridge.agreement, bridge._handle_type = True, Agreement(None, False), Handle
    bridge.observed, bridge.quarantine, bridge.stores = (
        ObservedManager(manager),
        Quarantine(Agreement(None, False)),
        StoreKeys(),
    )
    bridge._log, bridge._lookup_logs_rid = bridge.observed.log, False
    fails = iter([False] * earlier + [True])

    def lookup_kv(token_ids, token_mask, rid=None):
        tid, _ = bridge.observed.get_match(token_ids=token_ids)  # FlexKV's connector matches through the recorder
        if next(fails):
            raise BrokenPipeError("the transfer pipe closed")
        return tid, 16

    bridge.connector = SimpleNamespace(lookup_kv=lookup_kv, check_completed_stores=lambda: [])
    for i in range(earlier):
        assert bridge.lookup_kv([1] * 16, None, Handle(f"r{i}", 0)) == (i + 1, 16)
        if poll_between:
            assert bridge.check_completed_stores() == []
    assert bridge.lookup_kv([1] * 16, None, Handle("last", 0)) == (-1, 0)  # served as a miss
    assert manager.cancelled == [earlier + 1]  # its own match only


@given(st.integers(1, 50))
def test_the_store_poll_empties_the_record_that_calls_outside_a_lookup_load_or_store_fill(drains):
    """FlexKV's drain_launched_loads (every scheduler tick, through the bridge's __getattr__) waits through the
    recorder; nothing reads those entries, and the store poll SGLang makes every tick drops them."""
    from flexkv_adapter.integrations.sglang.outcomes import Agreement, ObservedManager, Quarantine
    from flexkv_adapter.integrations.sglang.stores import StoreKeys

    manager = _Manager("success")
    bridge = BridgeConnector.__new__(BridgeConnector)
    bridge.leader, bridge.agreement, bridge._handle_type = True, Agreement(None, False), Handle
    bridge.observed, bridge.quarantine, bridge.stores = (
        ObservedManager(manager),
        Quarantine(Agreement(None, False)),
        StoreKeys(),
    )
    bridge._log = bridge.observed.log

    def drain_launched_loads(threshold=100):
        bridge.observed.wait(list(range(threshold)), timeout=0.0, completely=True)  # connector.py:966-967

    bridge.connector = SimpleNamespace(drain_launched_loads=drain_launched_loads, check_completed_stores=lambda: [])
    for _ in range(drains):
        bridge.drain_launched_loads()
    assert len(bridge.observed.log) == drains  # what the recorder holds until the poll
    assert bridge.check_completed_stores() == []
    assert bridge.observed.log == []


@given(
    rids=st.lists(st.sampled_from(["a", "b", "a@attempt1"]), min_size=1, max_size=6),
    attempts=st.lists(st.integers(0, 2), min_size=6, max_size=6),
    held=st.sets(st.sampled_from(["a", "b"])),
)
def test_holds_lookup_answers_for_the_handle_asked_never_for_the_last_one_looked_up(rids, attempts, held):
    """The key a lookup made is reused only for that very handle: an equal or other handle asked next is keyed
    afresh (a held lookup of one request must never be read as another's)."""
    handle_type = Handle
    pending = {handle_key(handle_type(rid, 0)): 7 for rid in held}
    bridge = BridgeConnector.__new__(BridgeConnector)
    bridge.connector = SimpleNamespace(_pending_lookups=pending)
    for rid, attempt in zip(rids, attempts, strict=False):
        looked_up, asked = handle_type(rid, attempt), handle_type(rid if attempt % 2 else "b", 0)
        bridge._memo_handle, bridge._memo_key = looked_up, handle_key(looked_up)  # as lookup_kv leaves them
        assert bridge.holds_lookup(asked) is (handle_key(asked) in pending)
        assert bridge.holds_lookup(looked_up) is (handle_key(looked_up) in pending)
