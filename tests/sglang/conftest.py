"""The real-SGLang tier: SGLang's own pool classes, plugin loader and FlexKV connector on CPU.

Skips (visibly) without sglang. The ``sglang_env`` fixture gives each plugin test a clean hook
registry and, on request, a FlexKV stand-in of one API shape on ``sys.path``.

Install with ``bash scripts/install_sglang_cpu.sh`` (a separate .venv-sglang); ``scripts/test.sh``
runs this tier there.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from types import SimpleNamespace

import pytest

from flexkv_adapter.integrations.sglang.plugin import IN_TREE_MODULE

from . import flexkv_prefetch as prefetch
from . import flexkv_serving as serving
from . import flexkv_standin as fk

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.mem_cache import memory_pool as sglang_memory_pool
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: F401
except Exception as exc:  # ImportError, or a broken partial install
    sglang_memory_pool = None
    SKIP_REASON = f"sglang is not importable ({type(exc).__name__}: {exc}); run scripts/install_sglang_cpu.sh"
else:
    SKIP_REASON = ""


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON and os.environ.get("REQUIRE_ENGINE_TIER") == "1":
        # scripts/test.sh runs the tier where it just installed the engine: all-skipped is a failure there
        raise pytest.UsageError(f"the sglang tier cannot run: {SKIP_REASON}")
    for item in items:
        if "tests/sglang/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.sglang)
            if SKIP_REASON:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(autouse=True, scope="session")
def _quiet_sglang():
    logging.getLogger("sglang").setLevel(logging.ERROR)
    if sglang_memory_pool is not None:
        from sglang.srt.runtime_context import get_parallel

        get_parallel().override_permanently(attn_dcp_size=1)  # DSA pools read it; no process groups here


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
    for c, n in (
        (fk.OwnFlexKVConnector, "__init__"),
        (fk.TransferManagerOnRemote, "create_process"),
        (serving.ServingFlexKVConnector, "__init__"),
        (prefetch.PrefetchFlexKVConnector, "__init__"),
    )
]
_RADIX_PACKAGE = "sglang.srt.mem_cache.storage.flexkv."  # the radix cache is re-imported: hooks patch it


def _purge():
    for cls, name, raw in _ORIGINALS:
        setattr(cls, name, raw)
    if "__init__" in vars(serving.Drifted):  # a hook set it on the subclass
        del serving.Drifted.__init__
    for name in list(sys.modules):
        if name == "flexkv" or name.startswith(("flexkv.", IN_TREE_MODULE, _RADIX_PACKAGE)):
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
            serving.build_serving_tree(root, shape) if shape in serving.TREES else fk.build_tree(root, shape)
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
