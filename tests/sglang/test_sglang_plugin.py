"""The SGLang drop-in, end to end: SGLang's own plugin loader, its in-tree FlexKVConnector and real pools.

FlexKV is a stand-in (``flexkv_standin``) in two API shapes; everything else is SGLang 0.5.23 as
installed: ``load_plugins()`` finds the entry point in this project's installed dist-info, applies
the hooks, and the connector class is constructed as ``FlexKVRadixCache`` constructs it.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AdapterError, InconsistentLayersError, SettingsError
from flexkv_adapter.hybrid import HybridPoolError
from flexkv_adapter.integrations.external_remote import ExternalRemote, ExternalRemoteError
from flexkv_adapter.integrations.sglang import IN_TREE_CONNECTOR, module_exists

from ..helpers import flexkv_worker_read, region_bytes
from . import flexkv_standin as fk
from .test_sglang_pools import DSA_ARGS, KW, _fill, _hybrid_linear, _swa, mp

IN_TREE_MODULE = IN_TREE_CONNECTOR.rsplit(".", 1)[0]
OWN_MODULE = "flexkv.integration.sglang.connector"
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "num_hidden_layers": 3,
    "intermediate_size": 128,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}
DEEPSEEK = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "kv_lora_rank": 24,
    "q_lora_rank": None,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
    "rope_scaling": None,
}


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Real SGLang ModelConfig objects built from tiny config.json files."""
    from sglang.srt.configs.model_config import ModelConfig

    out = {}
    for name, config in (("llama", LLAMA), ("deepseek", DEEPSEEK)):
        path = tmp_path_factory.mktemp(name)
        (path / "config.json").write_text(json.dumps(config))
        out[name] = ModelConfig(model_path=str(path))
    return out


# Hooks patch these stand-in classes in place (the in-tree connector is re-imported instead).
_ORIGINALS = [
    (c, n, c.__dict__[n])
    for c, n in ((fk.OwnFlexKVConnector, "__init__"), (fk.TransferManagerOnRemote, "create_process"))
]


def _purge():
    for cls, name, raw in _ORIGINALS:
        setattr(cls, name, raw)
    for name in list(sys.modules):
        if name == "flexkv" or name.startswith("flexkv.") or name.startswith(IN_TREE_MODULE):
            del sys.modules[name]


@pytest.fixture
def sglang_env(monkeypatch, tmp_path_factory):
    """A clean plugin state; ``use(shape)`` puts a stand-in FlexKV of that shape on the path."""
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(world_group=SimpleNamespace(cpu_group=None))  # no process groups here
    for var in ("SGLANG_PLUGINS", "FLEXKV_ADAPTER_SGLANG", "FLEXKV_ADAPTER_CONFIG"):
        monkeypatch.delenv(var, raising=False)

    def reset():
        _purge()
        HookRegistry.reset()
        monkeypatch.setattr(plugins, "_plugins_loaded", False)
        fk.CALLS.clear()

    def use(shape):
        root = tmp_path_factory.getbasetemp() / f"flexkv-{shape}"
        if not root.exists():
            fk.build_tree(root, shape)
        monkeypatch.syspath_prepend(str(root))

    def load(plugins_env="flexkv_adapter", **env):
        if plugins_env is not None:
            monkeypatch.setenv("SGLANG_PLUGINS", plugins_env)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        plugins.load_plugins()

    reset()
    yield SimpleNamespace(use=use, load=load, registry=HookRegistry)
    reset()


def build(pool, model, module=IN_TREE_MODULE, page_size=16, pp_rank=0, **server):
    """Construct the connector as FlexKVRadixCache.__init__ does (keyword arguments only)."""
    cls = importlib.import_module(module).FlexKVConnector
    return cls(
        sgl_model_config=model,
        server_args=fk.ServerArgs(**server),
        page_size=page_size,
        kvcache=pool,
        tp_rank=0,
        dp_rank=0,
        pp_rank=pp_rank,
        attn_cp_rank=0,
    )


def mha_pool(layers=3, start_layer=None, size=72, head_num=4):
    pool = mp().MHATokenToKVPool(
        size=size,
        page_size=16,
        dtype=torch.bfloat16,
        head_num=head_num,
        head_dim=8,
        layer_num=layers,
        start_layer=start_layer,
        **KW,
    )
    _fill(pool.k_buffer), _fill(pool.v_buffer, 100)
    return pool


def mla_pool():
    pool = mp().MLATokenToKVPool(
        size=72, page_size=16, dtype=torch.bfloat16, kv_lora_rank=24, qk_rope_head_dim=8, layer_num=2, **KW
    )
    _fill(pool.kv_buffer)
    return pool


class Renamed:
    """A wrapper FlexKV's connector alone refuses: SGLang's tensors under other names."""

    def __init__(self, pool):
        self.key_cache, self.value_cache, self.page_size = pool.k_buffer, pool.v_buffer, pool.page_size


def assert_registered_as_pool(planes, page_size=16):
    """One registration whose tensors alias ``planes`` and whose blocks FlexKV reads from the right bytes."""
    (reg,) = fk.calls("register_to_server")
    layers = len(planes[0])
    flat = [t for plane in planes for t in plane]
    assert len(reg["kv_caches"]) == len(flat)
    fields = fk.layout_fields(reg["kv_layout"])
    assert fields["num_layer"] == layers and fields["tokens_per_block"] == page_size
    for got, pool_t in zip(reg["kv_caches"], flat):
        assert got.untyped_storage().data_ptr() == pool_t.untyped_storage().data_ptr()  # zero-copy
        got.view(torch.uint8).view(got.shape[0], -1)[3].fill_(77)  # written through the registered tensor ...
        assert (pool_t.view(torch.uint8).view(pool_t.shape[0], -1)[3] == 77).all()  # ... read through the pool
    for layer in range(layers):
        for kv, plane in enumerate(planes):
            for block in range(fields["num_block"]):
                expected = region_bytes(plane[layer][block * page_size : (block + 1) * page_size])
                assert flexkv_worker_read(fields, reg["kv_caches"], layer, kv, block) == expected
    return reg


# --- opt-in, discovery, no-op -----------------------------------------------------------------------


def test_entry_point_is_installed_and_loaded_by_sglang(sglang_env):
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "flexkv_adapter"]
    assert ep.value == "flexkv_adapter.integrations.sglang:install" and ep.dist.name == "flexkv-adapter"
    sglang_env.use("old")
    sglang_env.load()
    assert set(sglang_env.registry._hooks) == {f"{IN_TREE_CONNECTOR}.__init__"}
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
        f"{IN_TREE_CONNECTOR}.__init__",
        f"{OWN_MODULE}.FlexKVConnector.__init__",
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


def test_pipeline_stage_pool_matches_its_stage(sglang_env, models):
    """pp rank 1 of 2 over 3 layers holds layers 1..2 (SGLang's get_pp_indices), as FlexKV counts them."""
    sglang_env.use("current")  # the in-tree connector needs real process groups at pp_size > 1
    sglang_env.load()
    pool = mha_pool(layers=2, start_layer=1)
    build(pool, models["llama"], module=OWN_MODULE, pp_rank=1, pp_size=2)
    assert_registered_as_pool([pool.k_buffer, pool.v_buffer])


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


@pytest.mark.parametrize("factory", [_swa, _hybrid_linear], ids=["swa", "hybrid-linear"])
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
        build(_swa(), models["deepseek"])


@pytest.mark.parametrize(
    ("pool", "server", "page_size", "match"),
    [
        (lambda: mha_pool(layers=2), {}, 16, "holds 2 layers but FlexKV's connector registers num_layer=3"),
        (lambda: mha_pool(layers=3), {"pp_size": 2}, 16, "num_layer=1 \\(layers 0..0 of num_hidden_layers=3"),
        (mha_pool, {}, 32, "page_size=32 contradicts pool.page_size=16"),
        (lambda: mha_pool(head_num=4), {"tp_size": 2}, 16, "4 KV heads per rank at attention TP size 2"),
        (mla_pool, {}, 16, "sglang-mha|MLA"),
    ],
    ids=["layers", "pp-stage", "page-size", "heads", "kind"],
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


def test_settings_that_fail_to_load_stop_the_connector(sglang_env, models):
    sglang_env.use("old")
    sglang_env.load(FLEXKV_ADAPTER_REMOTE="exernal")
    with pytest.raises(SettingsError, match="(?s)loading its settings.*remote='exernal'"):
        build(mha_pool(), models["llama"])
    assert not fk.calls("create_process") and not fk.calls("KVManager")


# --- remote on nodes >= 1 --------------------------------------------------------------------------

NODE1 = {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"}


def test_remote_engine_leaves_flexkv_spawn_alone(sglang_env, models):
    sglang_env.use("old")
    sglang_env.load()
    build(mha_pool(), models["llama"], **NODE1)
    assert fk.calls("create_process") == [{"master_host": "10.0.0.1", "master_ports": ("5556", "5557", "5558")}]


@pytest.fixture
def start_remote_standin():
    """start_remote's own state tracker and health endpoint, without a FlexKV remote behind them."""
    from flexkv_adapter.remote.states import HealthServer, State, StateTracker

    tracker = StateTracker({"master": "10.0.0.1:5556", "node_rank": 1})
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    yield SimpleNamespace(tracker=tracker, port=server.address[1], State=State)
    server.stop()


@pytest.mark.parametrize("module", [IN_TREE_MODULE, OWN_MODULE], ids=["in-tree", "flexkv-own"])
def test_remote_external_waits_for_start_remote_and_spawns_nothing(sglang_env, models, start_remote_standin, module):
    import threading

    standin = start_remote_standin
    standin.tracker.set(standin.State.HANDSHAKE)
    threading.Timer(0.6, standin.tracker.set, (standin.State.WAITING_FOR_GPUS,)).start()
    sglang_env.use("old" if module == IN_TREE_MODULE else "current")
    sglang_env.load(FLEXKV_ADAPTER_REMOTE="external", FLEXKV_ADAPTER_HEALTH_PORT=str(standin.port))
    start = time.monotonic()
    connector = build(mha_pool(), models["llama"], module=module, **NODE1)
    assert time.monotonic() - start >= 0.5  # it waited for waiting_for_gpus
    assert not fk.calls("create_process")
    assert isinstance(connector._remote_process, ExternalRemote) and len(fk.calls("register_to_server")) == 1
    connector.shutdown()  # terminate / join / is_alive on the handle: nothing to stop
    assert connector._remote_process is None


def test_remote_external_without_start_remote_fails_fast_naming_it(sglang_env, models):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sglang_env.use("old")
    sglang_env.load(
        FLEXKV_ADAPTER_REMOTE="external", FLEXKV_ADAPTER_HEALTH_PORT=str(port), FLEXKV_ADAPTER_REMOTE_ABSENT_S="1"
    )
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match="scripts/start_remote.py is not running on this node"):
        build(mha_pool(), models["llama"], **NODE1)
    assert time.monotonic() - start < 10
    assert not fk.calls("create_process") and not fk.calls("register_to_server")
