"""How FlexKV reaches vLLM's KV memory, as vLLM 0.34 asks it: ``kv_cache_access`` answers legacy CUDA IPC.

vLLM 0.34 turns on the extensible KV cache by default on CUDA and ROCm (``VllmConfig._resolve_extensible_kv_cache``,
config/vllm.py:3180-3266): driver-mapped memory, one storage per layer, committed after warm-up, released by sleep
and lent to a weight update. What the connector answers to ``KVConnectorBase_V1.kv_cache_access`` (base.py:205-213)
decides how that memory is allocated, or whether it is used. vLLM's ``FlexKVConnectorV1`` does not answer, so it
declares ``IN_PROCESS``: the memory gets no shareable handle type (extensible_kv_cache.py:406-418) and FlexKV's
export, which hands vLLM's KV memory to its transfer workers in other processes, raises "VMM allocation has no
shareable handle type set" (flexkv/common/memory_handle.py:688-692) at engine start.

The plugin answers ``LEGACY_IPC``: FlexKV shares vLLM's KV memory as 0.32 and 0.33 allocate it (one PyTorch
allocation, exported through CUDA IPC), so vLLM leaves the extensible cache off (config/vllm.py:3218-3222) and
refuses ``--enable-extensible-kv-cache`` with its reason (config/vllm.py:3262-3263). ``EXPORTS_FD`` would keep the
extensible cache, but as memory nothing here was proven on: one storage per layer, pages released and recommitted
under FlexKV's mapping on sleep and lent out for weight updates, and vLLM would refuse to start wherever the
extensible cache is unsupported (CPU, ``kv_cache_memory_bytes``, ``num_gpu_blocks_override``: config/vllm.py:3238-3245).
"""

from __future__ import annotations

import importlib
from typing import Any

NAME = "kv_cache_access"  # its entry in lifecycle.PATCHES; a classmethod of vLLM 0.34's KVConnectorBase_V1


def kv_cache_access(cls: Any, kv_transfer_config: Any) -> Any:
    """``KVCacheAccess.LEGACY_IPC``: FlexKV's workers import vLLM's KV memory through legacy CUDA IPC."""
    return importlib.import_module("vllm.config.kv_transfer").KVCacheAccess.LEGACY_IPC


__all__ = ["NAME", "kv_cache_access"]
