"""vLLM 0.34's KV memory decision with the plugin: FlexKV's connector answers ``kv_cache_access`` with legacy CUDA
IPC, and vLLM's own config code (``VllmConfig._resolve_extensible_kv_cache``) then keeps the extensible KV cache off.

Only the decision runs on CPU: the platform it reads is vLLM's CUDA platform enum (a ``Platform`` whose ``_enum`` is
CUDA) or vLLM's ``CpuPlatform``, swapped in for the one call. Without the plugin's answer (the negative control)
vLLM 0.34 turns the extensible cache on for CUDA, and FlexKV's export of that memory fails at engine start.
"""

from __future__ import annotations

import pytest

from flexkv_adapter import UnsupportedFeatureError
from flexkv_adapter.integrations.vllm import kv_memory

from .build import allocate, connector_config
from .test_vllm_plugin import roles


def _asks_kv_cache_access() -> bool:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    return hasattr(KVConnectorBase_V1, kv_memory.NAME)


needs_034 = pytest.mark.skipif("not _asks_kv_cache_access()", reason="vLLM < 0.34 asks no kv_cache_access")


def _platform(kind: str):
    if kind == "cpu":
        from vllm.platforms.cpu import CpuPlatform

        return CpuPlatform()
    from vllm.platforms.interface import Platform, PlatformEnum

    class Cuda(Platform):  # vLLM's own is_cuda_alike()/is_rocm() read the enum
        _enum = PlatformEnum.CUDA

    return Cuda()


def decide(tmp_path, monkeypatch, kind: str, requested: bool | None = None) -> bool:
    """vLLM 0.34's extensible-cache decision for a FlexKVConnectorV1 config, on the ``kind`` platform."""
    import vllm.platforms

    config = connector_config(tmp_path, "mha3")
    cache = config.cache_config
    cache.enable_extensible_kv_cache, cache._extensible_kv_cache_resolved = requested, False
    with monkeypatch.context() as patch:  # the platform for this one call: the config above was built on CPU
        patch.setattr(vllm.platforms, "_current_platform", _platform(kind))
        config._resolve_extensible_kv_cache()
    return bool(cache.enable_extensible_kv_cache)


def test_the_plugin_answers_legacy_ipc_where_vllm_asks_and_adds_nothing_where_it_does_not(plugged, tmp_path):
    if not _asks_kv_cache_access():  # vLLM 0.32, 0.33: nothing to answer, nothing added
        assert kv_memory.NAME not in vars(plugged)
        return
    from vllm.config.kv_transfer import KVCacheAccess
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    transfer = connector_config(tmp_path, "mha3").kv_transfer_config
    assert plugged.kv_cache_access(transfer) is KVCacheAccess.LEGACY_IPC
    assert KVConnectorFactory.kv_cache_access(transfer) is KVCacheAccess.LEGACY_IPC  # what vLLM's config asks
    assert transfer.kv_cache_access() is KVCacheAccess.LEGACY_IPC and not transfer.registers_kv_cache_memory()


@needs_034
def test_on_cuda_vllms_decision_keeps_the_extensible_kv_cache_off_with_flexkv(plugged, tmp_path, monkeypatch):
    assert decide(tmp_path, monkeypatch, "cuda") is False


@needs_034
def test_negative_control_without_the_plugins_answer_cuda_turns_the_extensible_kv_cache_on(
    connector_cls, tmp_path, monkeypatch
):
    from vllm.config.kv_transfer import KVCacheAccess

    transfer = connector_config(tmp_path, "mha3").kv_transfer_config
    assert transfer.kv_cache_access() is KVCacheAccess.IN_PROCESS  # vLLM's FlexKVConnectorV1 as shipped
    assert decide(tmp_path, monkeypatch, "cuda") is True


@needs_034
def test_on_cuda_an_explicit_extensible_kv_cache_is_refused_by_vllm_naming_legacy_ipc(plugged, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"enable_extensible_kv_cache: .*legacy CUDA IPC"):
        decide(tmp_path, monkeypatch, "cuda", requested=True)
    assert decide(tmp_path, monkeypatch, "cuda", requested=False) is False  # --no-enable-extensible-kv-cache


@needs_034
@pytest.mark.parametrize("plugin", [True, False])
def test_on_cpu_vllms_decision_is_off_with_or_without_the_plugins_answer(connector_cls, tmp_path, monkeypatch, plugin):
    if plugin:
        from flexkv_adapter.integrations.vllm.plugin import install

        install()
    assert decide(tmp_path, monkeypatch, "cpu") is False
    with pytest.raises(ValueError, match="only supported on CUDA and ROCm"):
        decide(tmp_path, monkeypatch, "cpu", requested=True)


@needs_034
def test_a_config_that_reached_the_connector_with_the_extensible_kv_cache_on_is_refused_naming_it(plugged, tmp_path):
    """vLLM decides before it loads no plugin (a config built without EngineArgs): the table refuses at start."""
    _, kv_cache_config, _ = allocate("LBNHC", "mha3")
    config = connector_config(tmp_path, "mha3")
    config.cache_config.enable_extensible_kv_cache = True
    for role in (roles().SCHEDULER, roles().WORKER):
        with pytest.raises(UnsupportedFeatureError, match=r"enable_extensible_kv_cache=True.*legacy CUDA IPC"):
            plugged(config, role, kv_cache_config)
    config.cache_config.enable_extensible_kv_cache = False  # negative control: vLLM's decision with the plugin
    plugged(config, roles().SCHEDULER, kv_cache_config)
