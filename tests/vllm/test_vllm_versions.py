"""The plugin on the vLLM it runs on (0.32, 0.33 or 0.34): each wrapper only where vLLM declares the method,
nothing added that vLLM lacks, and a version outside the proven range refused with the range named."""

from __future__ import annotations

import pytest

from flexkv_adapter.integrations.vllm import lifecycle as vllm_lifecycle

from .engine import Engine


def base_class():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return KVConnectorBase_V1


def test_every_wrapper_the_running_vllm_declares_is_applied_and_no_other(plugged):
    declared = {n for n in vllm_lifecycle.PATCHES if hasattr(base_class(), n) or n in vars(plugged)}
    wrapped = {n for n in vllm_lifecycle.PATCHES if hasattr(getattr(plugged, n, None), "__wrapped__")}
    assert wrapped == declared == set(vllm_lifecycle.applicable(plugged))


def test_sleep_hooks_are_wrapped_exactly_where_the_base_class_has_them(plugged):
    for name in vllm_lifecycle.SLEEP_HOOKS:
        if hasattr(base_class(), name):  # vLLM 0.33, 0.34
            assert hasattr(getattr(plugged, name), "__wrapped__")
        else:  # vLLM 0.32: the plugin does not make it look like 0.33
            assert not hasattr(plugged, name)


def test_the_running_vllm_is_in_the_proven_range():
    import vllm

    assert vllm_lifecycle.version_problem(vllm.__version__) is None


@pytest.mark.parametrize("version", ["0.35.0", "0.31.2", "1.0.0", "unknown"])
def test_a_vllm_outside_the_proven_range_is_refused_naming_the_range(connector_cls, tmp_path, monkeypatch, version):
    import vllm

    from flexkv_adapter import AdapterError
    from flexkv_adapter.integrations.vllm.plugin import install

    monkeypatch.setattr(vllm, "__version__", version)
    install()
    with pytest.raises(AdapterError, match=r"proven on vLLM 0\.32, 0\.33 and 0\.34"):
        Engine(connector_cls, tmp_path)
    assert not hasattr(connector_cls.get_num_new_matched_tokens, "__wrapped__")  # never half-patched


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.33.1.dev4+g1a2b3c", "0.34.0", "0.34.2"])
def test_versions_in_the_range_are_accepted(version):
    assert vllm_lifecycle.version_problem(version) is None


@pytest.mark.parametrize("version", ["0.3", "0.320.0", "0.340.1", "0.35", "0.31.9", "", "v0.34"])
def test_versions_outside_the_range_are_named(version):
    assert "0.32, 0.33 and 0.34" in (vllm_lifecycle.version_problem(version) or "")


def test_an_out_of_range_vllm_still_gets_an_install_that_does_not_raise(connector_cls, monkeypatch):
    """vLLM calls plugins without a try: the refusal waits for the connector's construction."""
    import vllm

    from flexkv_adapter.integrations.vllm.plugin import install

    monkeypatch.setattr(vllm, "__version__", "0.35.0")
    install()
    assert "_flexkv_adapter_installed" in vars(connector_cls) and "kv_cache_access" not in vars(connector_cls)


def test_sleep_mode_is_refused_where_vllm_has_no_sleep_hooks_to_tell_flexkv(plugged, tmp_path):
    """Asleep, vLLM frees the KV memory FlexKV registered: without the hooks FlexKV would copy into it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from flexkv_adapter import AdapterError

    from .build import allocate, connector_config

    _, kv_cache_config, _ = allocate("LBNHC", "mha3", blocks=8)
    config = connector_config(tmp_path, "mha3")
    config.model_config.enable_sleep_mode = True
    has_hooks = all(hasattr(base_class(), n) for n in vllm_lifecycle.SLEEP_HOOKS)
    if has_hooks:  # vLLM 0.33: the wrappers unregister and restore FlexKV's registration
        plugged(config, KVConnectorRole.SCHEDULER, kv_cache_config)
    else:  # vLLM 0.32
        with pytest.raises(AdapterError, match="enable_sleep_mode with FlexKV needs vLLM's sleep/wake"):
            plugged(config, KVConnectorRole.SCHEDULER, kv_cache_config)
    config.model_config.enable_sleep_mode = False
    plugged(config, KVConnectorRole.SCHEDULER, kv_cache_config)  # without sleep mode: served on both


def test_vllm_034s_other_new_hooks_keep_vllms_own_answers(plugged, tmp_path):
    """``may_load_async`` (FlexKV hits never load early: docs/vllm.md#features) and ``supports_lookahead_block_hashes``
    (False: lookahead hashing needs speculative decoding, refused) are left to vLLM's base class."""
    from .build import connector_config

    for name in ("may_load_async", "supports_lookahead_block_hashes"):
        assert name not in vars(plugged)
    if hasattr(base_class(), "supports_lookahead_block_hashes"):  # vLLM 0.34
        transfer = connector_config(tmp_path, "mha3").kv_transfer_config
        assert plugged.supports_lookahead_block_hashes(transfer) is False
