"""The SGLang drop-in, end to end: SGLang's own plugin loader, its in-tree FlexKVConnector and real pools.

FlexKV is a stand-in (``flexkv_standin``) in two API shapes; everything else is SGLang 0.5.23 as
installed: ``load_plugins()`` finds the entry point in this project's installed dist-info, applies
the hooks, and the connector class is constructed as ``FlexKVRadixCache`` constructs it.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, InconsistentLayersError, SettingsError, UnsupportedFeatureError
from flexkv_adapter.integrations.sglang.namespaces import RADIX_CLASS
from flexkv_adapter.integrations.sglang.plugin import IN_TREE_CONNECTOR, IN_TREE_MODULE, module_exists
from flexkv_adapter.model.hybrid import HybridPoolError

from . import flexkv_standin as fk
from .connectors import OWN_MODULE, Renamed, assert_registered_as_pool, build
from .pools import DSA_ARGS, mamba_hybrid, mha_pool, mla_pool, mp, swa

# the namespace hooks, the abort hook (sglang_aborts), the load / store / flush hooks (sglang_flush) and the
# held-lookup hooks (sglang_lookups)
RADIX_METHODS = ("match_prefix", "checkpoint", "release_aborted_request", "__init__", "init_load_back", "reset")
NAMESPACE_HOOKS = {f"{RADIX_CLASS}.{m}" for m in (*RADIX_METHODS, "on_release")}

# --- opt-in, discovery, no-op -----------------------------------------------------------------------


def test_entry_point_is_installed_and_loaded_by_sglang(sglang_env):
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "flexkv_adapter"]
    assert ep.value == "flexkv_adapter.integrations.sglang:install" and ep.dist.name == "flexkv-adapter"
    sglang_env.use("old")
    sglang_env.load()
    assert set(sglang_env.registry._hooks) == {f"{IN_TREE_CONNECTOR}.__init__", *NAMESPACE_HOOKS}
    assert hasattr(importlib.import_module(IN_TREE_MODULE).FlexKVConnector.__init__, "__wrapped__")


@pytest.mark.parametrize("plugins_env", [None, "some_other_plugin"])
def test_no_hooks_without_the_opt_in(sglang_env, plugins_env):
    sglang_env.use("old")
    sglang_env.load(plugins_env)
    assert not sglang_env.registry._hooks and IN_TREE_MODULE not in sys.modules


def test_opt_in_by_variable_when_every_plugin_loads(sglang_env):
    sglang_env.use("current")
    sglang_env.load(None, FLEXKV_ADAPTER_SGLANG="1")
    assert set(sglang_env.registry._hooks) == {
        IN_TREE_CONNECTOR,  # replaced by the bridge to FlexKV's own connector (test_sglang_bridge)
        f"{OWN_MODULE}.FlexKVConnector.__init__",
        *NAMESPACE_HOOKS,
    }


def test_quiet_no_op_without_flexkv(sglang_env, caplog):
    assert not module_exists("flexkv") and not module_exists(IN_TREE_MODULE + ".nothing")
    sglang_env.load()
    assert not sglang_env.registry._hooks
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") or r.exc_info]
    importlib.import_module("sglang.srt.mem_cache.storage.flexkv")  # SGLang itself still imports


def test_module_lookup_imports_no_parent(sglang_env):
    sglang_env.use("old")
    assert module_exists("flexkv.server.client") and not module_exists("flexkv.integration.sglang.connector")
    assert "flexkv" not in sys.modules and "flexkv.server" not in sys.modules


# --- adapt at construction -------------------------------------------------------------------------


@pytest.mark.parametrize("renamed", [False, True], ids=["mha", "renamed"])
def test_in_tree_connector_registers_the_adapted_mha_pool(sglang_env, models, caplog, renamed):
    caplog.set_level(logging.INFO, logger="flexkv_adapter")
    sglang_env.use("old")
    sglang_env.load()
    pool = mha_pool()
    build(Renamed(pool) if renamed else pool, models["llama"])
    reg = assert_registered_as_pool([pool.k_buffer, pool.v_buffer])
    assert reg["kv_layout"].num_block == 5 and reg["kv_layout"].is_mla is False  # 88 rows -> 80 (page 16)
    (line,) = [m for m in caplog.messages if "flexkv_adapter (SGLang plugin)" in m and "view via" in m]
    assert "\n" not in line and "bytes copied 0" in line


@pytest.mark.parametrize(("env", "module"), [("current", OWN_MODULE), ("old", None)], ids=["flexkv-own", "in-tree"])
def test_a_pipeline_stage_is_refused_as_unproven_on_every_connector(sglang_env, models, env, module):
    """pp rank 1 of 2 over 3 layers: the pool matches its stage, but serving at PP is unproven (feature table)."""
    sglang_env.use(env)
    sglang_env.load()
    pool = mha_pool(layers=2, start_layer=1)
    with pytest.raises(UnsupportedFeatureError, match="pp_size=2: --pp-size is a pipeline-parallel topology"):
        build(pool, models["llama"], **({"module": module} if module else {}), pp_rank=1, pp_size=2)
    assert not fk.calls("register_to_server")


def test_without_the_plugin_the_connector_refuses_a_renamed_pool(sglang_env, models):
    sglang_env.use("old")
    with pytest.raises(AttributeError, match="Unsupported KV cache type Renamed"):
        build(Renamed(mha_pool()), models["llama"])


@pytest.mark.parametrize("pool_factory", [mla_pool, lambda: mp().DSATokenToKVPool(**DSA_ARGS)], ids=["mla", "dsa"])
def test_in_tree_connector_registers_mla_and_dsa_pools(sglang_env, models, pool_factory):
    sglang_env.use("old")
    sglang_env.load()
    pool = pool_factory()
    page = pool.page_size
    build(pool, models["deepseek"], page_size=page)
    reg = assert_registered_as_pool([pool.kv_buffer], page_size=page)
    assert reg["kv_layout"].is_mla is True
    indexer = getattr(pool, "index_k_with_scale_buffer", None)
    if indexer is not None:  # DSA: the indexer planes reach FlexKV as the pool's own tensors
        assert [t.data_ptr() for t in reg["indexer_buffers"]] == [t.data_ptr() for t in indexer]


def test_flexkv_own_connector_is_hooked_too(sglang_env, models):
    sglang_env.use("current")
    sglang_env.load()
    pool = mha_pool()
    build(Renamed(pool), models["llama"], module=OWN_MODULE)
    reg = assert_registered_as_pool([pool.k_buffer, pool.v_buffer])
    assert reg["kv_layout"].kv_dim == 2 and reg["kv_layout"].num_kv_heads == 4


# --- refusals at engine start ----------------------------------------------------------------------


@pytest.mark.parametrize("factory", [swa, mamba_hybrid], ids=["swa", "hybrid-linear"])
@pytest.mark.parametrize("setting", ["error", "attention_only"])
def test_hybrid_pools_are_refused_without_suggesting_attention_only(sglang_env, models, factory, setting):
    sglang_env.use("old")
    sglang_env.load(FLEXKV_ADAPTER_HYBRID=setting)
    with pytest.raises(HybridPoolError) as err:
        build(factory(), models["llama"])
    msg = str(err.value)
    assert msg.startswith("flexkv_adapter (SGLang plugin), adapting the KV pool for")
    assert "cannot offload this model correctly" in msg and "layer count from the model config" in msg
    assert "Not offloaded:" in msg and "FLEXKV_ADAPTER_HYBRID" not in msg and "pass adapt(" not in msg
    assert ("does not apply under the SGLang plugin" in msg) == (setting == "attention_only")
    assert not fk.calls("register_to_server")


def test_swa_pool_for_an_mla_model_is_the_seed_error(sglang_env, models):
    sglang_env.use("old")
    sglang_env.load()
    with pytest.raises(InconsistentLayersError, match="Layer 1 is not backed by an MLA KV pool"):
        build(swa(), models["deepseek"])


@pytest.mark.parametrize(
    ("pool", "server", "page_size", "match"),
    [
        (lambda: mha_pool(layers=2), {}, 16, "holds 2 layers but FlexKV's connector registers num_layer=3"),
        (lambda: mha_pool(layers=3), {"pp_size": 2}, 16, "pp_size=2: --pp-size is a pipeline-parallel topology"),
        (mha_pool, {}, 32, "page_size=32 contradicts pool.page_size=16"),
        (lambda: mha_pool(head_num=4), {"tp_size": 2}, 16, "4 KV heads per rank at attention TP size 2"),
        (mla_pool, {}, 16, "MLATokenToKVPool is an MLA pool \\(kv_buffer\\) but FlexKV treats the model as MHA"),
        (lambda: SimpleNamespace(page_size=16), {}, 16, "no recogniser found FlexKV-ready KV buffers"),
        (lambda: mha_pool(head_dim=16), {}, 16, "16 elements per head but FlexKV sizes its blocks for head_size=8"),
        (lambda: mha_pool(v_head_dim=4), {}, 16, "K and V head dims differ \\(\\[4, 8\\]\\)"),
    ],
    ids=["layers", "pp-stage", "page-size", "heads", "kind", "unrecognised", "head-size", "v-head-dim"],
)
def test_mismatches_with_the_connector_are_refused(sglang_env, models, pool, server, page_size, match):
    sglang_env.use("old")
    sglang_env.load()
    with pytest.raises(AdapterError, match=match):
        build(pool(), models["llama"], page_size=page_size, **server)
    assert not fk.calls("register_to_server") and not fk.calls("KVManager")


def test_one_head_per_rank_is_refused_where_flexkv_reads_it_as_shared(sglang_env, models):
    sglang_env.use("current")
    sglang_env.load()
    with pytest.raises(InconsistentLayersError, match="registers num_kv_heads=1, which FlexKV reads as"):
        build(mha_pool(head_num=1), models["llama"], module=OWN_MODULE, tp_size=4)


def test_in_tree_connector_on_current_flexkv_is_refused_at_once(sglang_env, models):
    sglang_env.use("current")
    sglang_env.load()
    start = time.monotonic()
    with pytest.raises(AdapterError) as err:
        build(mha_pool(), models["llama"])
    assert time.monotonic() - start < 5  # not the connector's 360 x 1 s registration retry
    msg = str(err.value)
    for part in (
        "indexer_buffers=",
        "is_mla=",
        "use_mla",
        "56c71a7",
        "c213e5d",
        "b70205e",
        "flexkv.integration.sglang",
    ):
        assert part in msg
    assert not fk.calls("KVManager")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"FLEXKV_ADAPTER_REMOTE": "exernal"}, "(?s)loading its settings.*remote='exernal'"),
        ({"FLEXKV_ADAPTER_CONFIG": "{yaml}"}, "(?s)loading its settings.*bad.yaml is invalid YAML: line 2"),
        ({"FLEXKV_SERVER_RECV_PORT": "ipc://flexkv/sock"}, "(?s)loading its settings.*relative ipc path"),
    ],
    ids=["bad-value", "malformed-yaml", "relative-ipc"],
)
def test_settings_that_fail_to_load_stop_the_connector(sglang_env, models, tmp_path, env, match):
    (tmp_path / "bad.yaml").write_text("remote: [external\n")
    sglang_env.use("old")
    sglang_env.load(**{k: v.format(yaml=tmp_path / "bad.yaml") for k, v in env.items()})
    with pytest.raises(SettingsError, match=match):
        build(mha_pool(), models["llama"])
    assert not fk.calls("create_process") and not fk.calls("KVManager")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layers=st.integers(1, 4),
    heads=st.sampled_from([1, 2, 4, 8]),
    page=st.sampled_from([1, 8, 16]),
    size=st.integers(16, 80),
    tp=st.sampled_from([1, 2, 4]),
    stage=st.sampled_from([(0, 1), (0, 2), (1, 2), (2, 3)]),
)
def test_any_geometry_is_registered_correctly_or_refused(sglang_env, models, layers, heads, page, size, tp, stage):
    """The model has 3 layers and 4 KV heads: the pool reaches FlexKV exactly when FlexKV reads it right."""
    from sglang.srt.distributed.utils import get_pp_indices

    pp_rank, pp = stage
    sglang_env.use("current")
    sglang_env.load()
    fk.CALLS.clear()
    first, end = get_pp_indices(3, pp_rank, pp)
    pool = mha_pool(layers=layers, start_layer=first, size=size, head_num=heads, page_size=page)
    readable = pp == 1 and layers == end - first and heads * tp == 4 and not (heads == 1 and tp > 1)
    event("readable" if readable else "refused")
    try:
        build(pool, models["llama"], module=OWN_MODULE, page_size=page, pp_rank=pp_rank, pp_size=pp, tp_size=tp)
    except AdapterError:
        assert not readable and not fk.calls("register_to_server")
        return
    assert readable
    assert_registered_as_pool([pool.k_buffer, pool.v_buffer], page_size=page)
