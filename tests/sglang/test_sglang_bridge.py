"""SGLang 0.5.23's real FlexKVRadixCache served by FlexKV's own connector through the plugin's bridge.

FlexKV's own connector is a stand-in of 34ab141 (``flexkv_serving``); the radix cache, pools, paged
allocator, ReqToTokenPool, hook registry and plugin loader are SGLang's.
"""

from __future__ import annotations

import importlib
import logging

import pytest

from flexkv_adapter import AdapterError
from flexkv_adapter.integrations.sglang.bridge import BridgeConnector, handle_key
from flexkv_adapter.integrations.sglang.plugin import IN_TREE_MODULE

from . import flexkv_serving as serving
from . import flexkv_standin as fk
from .radix_harness import RADIX, Rig, read, zero
from .test_sglang_remote import start_remote_standin  # noqa: F401 (a fixture)

IDS = list(range(1000, 1048))  # three pages


def _served(rig, kind_seed=7, broken=False, monkeypatch=None):
    """Store a finished request, evict it, restore it for a new request into other slots."""
    req = rig.request("r1", IDS, prompt=40, seed=kind_seed)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    assert rig.evict_all() == 0  # evict polls once (running): FlexKV owns the slots until the host copy is terminal
    rig.cache.check_hicache_events()  # the scheduler's poll: the host copy ran, the node is unlocked
    assert rig.evict_all() == len(IDS)
    zero(rig.pool, req.slots)
    blocker = rig.alloc.alloc(len(IDS))  # the old slots may be handed out again: restore must go elsewhere
    before = read(rig.pool, blocker)
    loaded, slots = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    return req, expected, loaded, slots, blocker, before


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_store_evict_restore_is_byte_exact_through_the_real_radix_cache(sglang_env, models, monkeypatch, kind, caplog):
    caplog.set_level(logging.INFO, logger="flexkv_adapter")
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama" if kind == "mha" else "deepseek"], kind)
    assert isinstance(rig.cache.flexkv_connector, BridgeConnector)
    req, expected, loaded, slots, blocker, before = _served(rig)
    assert loaded == len(IDS) and slots is not None
    assert not set(slots.tolist()) & set(req.slots.tolist())
    assert read(rig.pool, slots) == expected
    assert read(rig.pool, blocker) == before  # nothing else written
    (line,) = [r.getMessage() for r in caplog.records if "handle bridge" in r.getMessage()]
    assert "FlexKV's own connector" in line and "indexer_buffers" in line
    assert [c["rid"] for c in fk.calls("store_kv")] == [handle_key(req.cache_request_handle)] == ["r1@attempt0"]
    assert fk.calls("store_kv")[0]["sglang_req_id"] == "r1"


def test_the_hits_line_counts_what_the_radix_cache_matched_and_restored(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama"], "mha")
    _, _, loaded, _, _, _ = _served(rig)
    counts = rig.cache.flexkv_connector.hits_log.counts
    assert loaded == len(IDS)
    assert (counts["lookups"], counts["hits"], counts["hit_tokens"]) == (1, 1, len(IDS))
    assert (counts["loads"], counts["restored_tokens"], counts["failed_loads"]) == (1, len(IDS), 0)


def test_negative_control_a_registration_that_does_not_alias_the_pool_fails(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama"], "mha")
    reg = fk.calls("register_to_server")[-1]
    reg["kv_caches"] = [t.clone() for t in reg["kv_caches"]]  # broken on purpose: copies, not the pool
    _, expected, loaded, slots, _, _ = _served(rig)
    assert loaded == len(IDS) and read(rig.pool, slots) != expected


def test_a_pool_only_adapt_makes_acceptable_is_served(sglang_env, models, monkeypatch):
    from .connectors import Renamed
    from .pools import mha_pool

    sglang_env.use("serving")
    sglang_env.load()
    pool = mha_pool(size=256)
    rig = Rig(monkeypatch, models["llama"], "mha", pool=pool, kvcache=Renamed(pool))  # FlexKV alone refuses it
    (reg,) = fk.calls("register_to_server")
    assert reg["kv_caches"][0].data_ptr() == pool.k_buffer[0].data_ptr()
    _, expected, loaded, slots, _, _ = _served(rig)
    assert loaded == len(IDS) and read(rig.pool, slots) == expected


def test_retry_with_a_new_attempt_loses_no_completion(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama"], "mha")
    first = rig.request("r1", IDS, prompt=40, seed=1)
    rig.finish(first)
    retry = rig.request("r1", IDS[:32] + list(range(2000, 2016)), prompt=40, attempt=1, seed=2)
    rig.finish(retry)
    keys = [c["rid"] for c in fk.calls("store_kv")]
    assert keys == ["r1@attempt0", "r1@attempt1"]
    assert len(rig.cache._inflight_store_nodes) == 2
    rig.cache.check_hicache_events()
    rig.cache.check_hicache_events()
    assert not rig.cache._inflight_store_nodes  # both completions came back as SGLang's own handles
    assert rig.evict_all() == 64


def test_a_repeated_lookup_cancels_only_its_own_attempt(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama"], "mha")
    rig.finish(rig.request("r0", IDS, prompt=40, seed=3))
    for _ in range(2):
        rig.cache.check_hicache_events()
    rig.evict_all()
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    a0 = rig.request("r1", IDS, prompt=40, allocate=False)
    a1 = rig.request("r1", IDS, prompt=40, attempt=1, allocate=False)
    for req in (a0, a1, a1):
        rig.cache.match_prefix(MatchPrefixParams(key=RadixKey(IDS, None), req=req))
    conn = rig.cache.flexkv_connector.connector
    assert set(conn._pending_lookups) == {"r1@attempt0", "r1@attempt1"}
    assert len(fk.calls("cancel")) == 1  # only attempt 1's replaced lookup


def test_a_flexkv_whose_connector_changed_is_refused_naming_the_method(sglang_env, models, monkeypatch):
    sglang_env.use("drifted")
    sglang_env.load()
    with pytest.raises(AdapterError, match=r"store_kv\(\) takes \(request_key, token_ids, kv_indices\)") as err:
        Rig(monkeypatch, models["llama"], "mha")
    assert "indexer_buffers" in str(err.value)  # the in-tree reason too
    assert not fk.calls("register_to_server") and not fk.calls("KVManager")


def test_flexkv_connector_before_the_ownership_fix_is_refused(sglang_env, models, monkeypatch):
    sglang_env.use("pre263")
    sglang_env.load()
    with pytest.raises(AdapterError, match=r"predates FlexKV 94915c4 \(#263"):
        Rig(monkeypatch, models["llama"], "mha")
    assert not fk.calls("register_to_server")


def test_layerwise_mode_is_refused_as_unproven(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load(FLEXKV_ENABLE_LAYERWISE_TRANSFER="1")
    with pytest.raises(AdapterError, match="FLEXKV_ENABLE_LAYERWISE_TRANSFER=1: SGLang's layerwise FlexKV path"):
        Rig(monkeypatch, models["llama"], "mha")
    assert not fk.calls("register_to_server")


@pytest.mark.parametrize("server", [{"pp_size": 2}, {"enable_dp_attention": True, "dp_size": 2}])
def test_unproven_topologies_are_refused_by_the_bridge(sglang_env, models, server):
    from .connectors import build
    from .pools import mha_pool

    sglang_env.use("serving")
    sglang_env.load()
    with pytest.raises(AdapterError, match="choosing the connector for FlexKVRadixCache: (pp_size=2|dp_size=2)"):
        build(mha_pool(), models["llama"], **server)  # what FlexKVRadixCache builds: the bridge
    assert not fk.calls("register_to_server")


def test_dsa_pool_is_refused_for_flexkv_own_connector_naming_the_indexer(sglang_env, models, monkeypatch):
    from .connectors import build
    from .pools import DSA_ARGS, mp

    sglang_env.use("serving")
    sglang_env.load()
    pool = mp().DSATokenToKVPool(**DSA_ARGS)
    refusal = "index_k_with_scale_buffer.*overwriting the following pages"
    with pytest.raises(AdapterError, match=refusal):  # built directly
        build(pool, models["deepseek"], module="flexkv.integration.sglang.connector", page_size=64)
    with pytest.raises(AdapterError, match=refusal):  # bridged, through SGLang's radix cache
        Rig(monkeypatch, models["deepseek"], "mla", pool=pool, page=64)
    assert not fk.calls("register_to_server")


def test_dcp_is_refused(sglang_env, models, monkeypatch):
    from .connectors import build
    from .pools import mha_pool

    sglang_env.use("serving")
    sglang_env.load()
    monkeypatch.setattr(fk.ServerArgs, "dcp_size", 2, raising=False)
    with pytest.raises(AdapterError, match="dcp_size=2"):
        build(mha_pool(), models["llama"], module="flexkv.integration.sglang.connector")
    assert not fk.calls("register_to_server")


@pytest.mark.parametrize("namespace", [{"extra_key": "lora-a"}, {"cache_salt": "tenant-a"}])
def test_namespaced_requests_get_no_other_namespaces_kv_and_store_their_own(sglang_env, models, monkeypatch, namespace):
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama"], "mha")
    rig.finish(rig.request("plain", IDS, prompt=40, seed=5))  # a tenant without a namespace stores
    for _ in range(2):
        rig.cache.check_hicache_events()
    rig.evict_all()
    _, slots = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **namespace))
    assert slots is None  # FlexKV was asked under the request's namespace: nothing of the plain tenant's
    stores = len(fk.calls("store_kv"))
    rig.finish(rig.request("t", IDS, prompt=40, seed=6, **namespace))
    assert len(fk.calls("store_kv")) == stores + 1


@pytest.mark.parametrize("namespace", [{"extra_key": "lora-a"}, {"cache_salt": "tenant-a"}])
def test_with_skip_namespaced_requests_never_reach_flexkv(sglang_env, models, monkeypatch, namespace):
    sglang_env.use("serving")
    sglang_env.load(FLEXKV_ADAPTER_SGLANG_NAMESPACED_REQUESTS="skip")
    rig = Rig(monkeypatch, models["llama"], "mha")
    rig.finish(rig.request("plain", IDS, prompt=40, seed=5))  # a tenant without a namespace stores
    for _ in range(2):
        rig.cache.check_hicache_events()
    rig.evict_all()
    lookups = len(fk.calls("lookup_kv"))
    _, slots = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **namespace))
    assert slots is None and len(fk.calls("lookup_kv")) == lookups  # no lookup: no other namespace's KV
    stores = len(fk.calls("store_kv"))
    rig.finish(rig.request("t", IDS, prompt=40, seed=6, **namespace))
    assert len(fk.calls("store_kv")) == stores


def test_the_setting_shares_namespaces_as_sglang_does(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load(FLEXKV_ADAPTER_SGLANG_NAMESPACED_REQUESTS="shared")
    rig = Rig(monkeypatch, models["llama"], "mha")
    rig.finish(rig.request("plain", IDS, prompt=40, seed=5))
    for _ in range(2):
        rig.cache.check_hicache_events()
    rig.evict_all()
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, extra_key="lora-a"))
    assert loaded == len(IDS)  # the documented risk: another namespace's KV


@pytest.mark.parametrize("plugins_env", [None, "another_plugin"])
def test_without_the_opt_in_sglang_builds_its_in_tree_connector(sglang_env, plugins_env):
    sglang_env.use("serving")
    sglang_env.load(plugins_env)
    assert not sglang_env.registry._hooks
    radix = importlib.import_module(RADIX)
    assert radix.FlexKVConnector is importlib.import_module(IN_TREE_MODULE).FlexKVConnector
    assert radix.FlexKVConnector.__module__ == IN_TREE_MODULE and not hasattr(
        radix.FlexKVConnector.__init__, "__wrapped__"
    )
    assert not hasattr(radix.FlexKVRadixCache.match_prefix, "__wrapped__")


def test_with_the_opt_in_the_radix_cache_builds_the_bridge(sglang_env):
    sglang_env.use("serving")
    sglang_env.load()
    radix = importlib.import_module(RADIX)
    assert radix.FlexKVConnector is BridgeConnector is importlib.import_module(IN_TREE_MODULE).FlexKVConnector
    assert serving.ServingFlexKVConnector.__init__.__wrapped__  # the pool is adapted by the plugin's hook


def test_remote_external_holds_through_the_bridge(sglang_env, models, start_remote_standin):  # noqa: F811
    from flexkv_adapter.integrations.sglang.external_remote import ExternalRemote

    from .connectors import build
    from .pools import mha_pool

    start_remote_standin.tracker.set(start_remote_standin.State.WAITING_FOR_GPUS)
    sglang_env.use("serving")
    sglang_env.load(FLEXKV_ADAPTER_REMOTE="external", FLEXKV_ADAPTER_HEALTH_PORT=str(start_remote_standin.port))
    bridge = build(mha_pool(), models["llama"], nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    assert isinstance(bridge, BridgeConnector) and isinstance(bridge._remote_process, ExternalRemote)
    assert not fk.calls("create_process")
    bridge.shutdown()  # passed through to FlexKV's connector
    assert bridge._remote_process is None
