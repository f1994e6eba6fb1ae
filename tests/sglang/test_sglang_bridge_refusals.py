"""The SGLang bridge refuses what it cannot serve: DSA under a hybrid, a namespace hook that did not
apply, DP and KV sharding.

Real SGLang 0.5.23 pools and radix cache; FlexKV's own connector is the 34ab141 stand-in of the conftest.
"""

from __future__ import annotations

import pytest

from flexkv_adapter import AdapterError, adapt

from . import flexkv_standin as fk
from .pools import hybrid_linear

OWN = "flexkv.integration.sglang.connector"


def test_a_view_of_a_hybrid_whose_full_pool_is_dsa_is_refused_naming_the_indexer(sglang_env, models):
    """A pre-adapted (attention_only) view of a hybrid-linear DSA pool hides the indexer one level down
    (``source.full_kv_pool``): FlexKV would register the latent rows alone and restore prefixes with the
    indexer keys of whatever last used the slots."""
    from .connectors import build

    sglang_env.use("serving")
    sglang_env.load()
    pool = hybrid_linear(True, dsa=True)
    assert getattr(pool.full_kv_pool, "index_k_with_scale_buffer", None) is not None
    view = adapt(pool, hybrid="attention_only")
    with pytest.raises(AdapterError, match="DSATokenToKVPool has a DSA/NSA indexer"):
        build(view, models["deepseek"], module=OWN, page_size=64)
    assert not fk.calls("register_to_server")


def test_negative_control_the_same_view_without_dsa_is_served(sglang_env, models):
    from .connectors import build

    sglang_env.use("serving")
    sglang_env.load()
    view = adapt(hybrid_linear(True), hybrid="attention_only")
    build(view, models["deepseek"], module=OWN, page_size=16)
    assert fk.calls("register_to_server")


def test_the_bridge_refuses_dsa_even_where_the_hook_on_flexkvs_connector_did_not_apply(sglang_env, models, monkeypatch):
    """SGLang logs a hook that fails to apply and serves on; the bridge must not then hand a DSA pool
    (or dcp > 1) to FlexKV's connector unchecked."""
    import importlib
    import inspect

    from .pools import DSA_ARGS, mp
    from .radix_harness import Rig

    sglang_env.use("serving")
    sglang_env.load()
    cls = importlib.import_module(OWN).FlexKVConnector
    monkeypatch.setattr(cls, "__init__", inspect.unwrap(cls.__init__))  # "Failed to apply hooks to ...__init__"
    with pytest.raises(AdapterError, match="index_k_with_scale_buffer"):
        Rig(monkeypatch, models["deepseek"], "mla", pool=mp().DSATokenToKVPool(**DSA_ARGS), page=64)
    monkeypatch.setattr(fk.ServerArgs, "dcp_size", 2, raising=False)
    with pytest.raises(AdapterError, match="dcp_size=2"):
        Rig(monkeypatch, models["llama"], "mha")
    assert not fk.calls("register_to_server")


@pytest.mark.parametrize("method", ["match_prefix", "checkpoint", "release_aborted_request", "on_release"])
def test_the_bridge_refuses_to_serve_where_a_namespace_hook_did_not_apply(sglang_env, models, monkeypatch, method):
    """Without the AROUND hooks (SGLang logged them as failed), LoRA / cache_salt requests would look up
    and store by token ids alone: another tenant's KV (or, without the abort hook, an aborted request's
    slots could be reused while FlexKV stores them; without the lookup hooks, a lookup no load uses would pin
    FlexKV's blocks). The bridge refuses instead of serving."""
    import importlib
    import inspect

    from .radix_harness import RADIX, Rig

    sglang_env.use("serving")
    sglang_env.load()
    cls = importlib.import_module(RADIX).FlexKVRadixCache
    monkeypatch.setattr(cls, method, inspect.unwrap(getattr(cls, method)))
    with pytest.raises(AdapterError, match=f"FlexKVRadixCache.{method}"):
        Rig(monkeypatch, models["llama"], "mha")
    assert not fk.calls("register_to_server")


def test_match_prefix_has_one_hook_layer_holding_both_the_namespace_and_the_lookup_rule(
    sglang_env, models, monkeypatch
):
    """SGLang's hottest cache call pays its hook wrapper once: the lookup hook runs the namespace hook inside it. The
    start-up check still sees both; a layer with the lookup rule alone is refused as a missing namespace hook."""
    import importlib
    import inspect

    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    from flexkv_adapter.integrations.sglang.lookups import match_hook

    from .radix_harness import RADIX, Rig

    sglang_env.use("serving")
    sglang_env.load()
    cls = importlib.import_module(RADIX).FlexKVRadixCache
    original = inspect.unwrap(cls.match_prefix)
    assert cls.match_prefix.__wrapped__ is original  # one layer
    Rig(monkeypatch, models["llama"], "mha")
    monkeypatch.setattr(cls, "match_prefix", _wrap_fn(original, match_hook(None), HookType.AROUND))
    with pytest.raises(AdapterError, match="FlexKVRadixCache.match_prefix \\(LoRA"):
        Rig(monkeypatch, models["llama"], "mha")


def test_with_the_shared_setting_no_namespace_hook_is_needed(sglang_env, models, monkeypatch):
    from .radix_harness import Rig

    sglang_env.use("serving")
    sglang_env.load(FLEXKV_ADAPTER_SGLANG_NAMESPACED_REQUESTS="shared")
    Rig(monkeypatch, models["llama"], "mha")
    assert fk.calls("register_to_server")


class _Holder:
    """A user's wrapper that keeps SGLang's DSA pool under a name of its own."""

    def __init__(self, pool):
        self.inner, self.page_size = pool, pool.page_size


def test_a_view_read_by_attrs_from_a_wrapper_of_a_dsa_pool_is_refused(sglang_env, models):
    from .connectors import build
    from .pools import DSA_ARGS, mp

    sglang_env.use("serving")
    sglang_env.load()
    holder = _Holder(mp().DSATokenToKVPool(**DSA_ARGS))
    with pytest.raises(AdapterError, match="inner.index_k_with_scale_buffer"):  # adapt names the indexer it leaves
        adapt(holder, attrs="inner.kv_buffer", kind="mla")
    view = adapt(holder, attrs="inner.kv_buffer", kind="mla", hybrid="attention_only")  # the KV alone, asked for
    with pytest.raises(AdapterError, match="DSATokenToKVPool has a DSA/NSA indexer"):
        build(view, models["deepseek"], module=OWN, page_size=64)
    assert not fk.calls("register_to_server")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("attn_dp_size", 2, "attn_dp_size=2: --enable-dp-attention is DP attention"),  # 0.5.23 spelling
        ("dp_size", 2, "dp_size=2"),  # replicas: FlexKVRadixCache's factory passes dp_rank=None to each
        ("enable_kv_cache_sharding", True, "enable_kv_cache_sharding"),  # pages split across ranks, as dcp
    ],
)
def test_dp_in_sglang_0_5_23s_spelling_and_kv_sharding_are_refused_by_the_bridge(
    sglang_env, models, monkeypatch, field, value, message
):
    """SGLang 0.5.23 resolves ``--dp-size N --enable-dp-attention`` to ``attn_dp_size=N, dp_size=1,
    enable_dp_attention=False`` (arg_groups/parallel_hook.py:39-61), so a check of
    ``enable_dp_attention and dp_size > 1`` never fires; every DP rank would be FlexKV DP client 0."""
    import dataclasses

    from .connectors import build
    from .pools import mha_pool

    sglang_env.use("serving")
    sglang_env.load()
    server = {}
    if field in {f.name for f in dataclasses.fields(fk.ServerArgs)}:
        server[field] = value
    else:
        monkeypatch.setattr(fk.ServerArgs, field, value, raising=False)
    with pytest.raises(AdapterError, match=f"choosing the connector for FlexKVRadixCache: .*{message}"):
        build(mha_pool(), models["llama"], **server)  # what FlexKVRadixCache builds: the bridge
    assert not fk.calls("register_to_server")
