"""Build KV cache dicts with vLLM 0.33's own code: spec -> layout -> config -> kernel blocks -> views."""

from __future__ import annotations

import os
from typing import Any

import torch

CASES = {  # name: (spec kind, spec kwargs, attention backend module:class)
    "mha3": ("mha", dict(block_size=16, num_kv_heads=3, head_size=8), "flash_attn:FlashAttentionBackend"),
    "mha1": ("mha", dict(block_size=16, num_kv_heads=1, head_size=8), "flash_attn:FlashAttentionBackend"),
    "mla": ("mla", dict(block_size=64, num_kv_heads=1, head_size=24), "mla.flashmla:FlashMLABackend"),
    "mla128": ("mla", dict(block_size=128, num_kv_heads=1, head_size=24), "mla.flashmla:FlashMLABackend"),
}
LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")


def vllm_config(tp_size: int = 1, **kwargs: Any) -> Any:
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig

    return VllmConfig(
        device_config=DeviceConfig(device="cpu"), parallel_config=ParallelConfig(tensor_parallel_size=tp_size), **kwargs
    )


def spec_of(case: str, dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    kind, kwargs, _ = CASES[case]
    cls = MLAAttentionSpec if kind == "mla" else FullAttentionSpec
    return cls(dtype=dtype, **{**kwargs, **overrides})


def backend_of(case: str) -> Any:
    import importlib

    module, name = CASES[case][2].split(":")
    return getattr(importlib.import_module(f"vllm.v1.attention.backends.{module}"), name)


def allocate(
    layout: str, case: str, layers: int = 3, blocks: int = 5, spec: Any = None
) -> tuple[dict[str, torch.Tensor], Any, Any]:
    """(kv_caches, kv_cache_config, vllm_config) as vLLM 0.33's worker builds them, filled with random bytes."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec
    from vllm.v1.worker.utils import AttentionGroup, allocate_kv_cache, prepare_kernel_block_sizes

    spec = spec if spec is not None else spec_of(case)
    config = vllm_config()
    old = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    os.environ["VLLM_KV_CACHE_LAYOUT"] = layout
    try:
        resolved = resolve_kv_cache_layout(config, [[name for name in LAYOUTS]], [spec])
    finally:
        if old is None:
            del os.environ["VLLM_KV_CACHE_LAYOUT"]
        else:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = old
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    group = KVCacheGroupSpec(names, spec)
    kv_cache_config = get_kv_cache_config_from_groups(config, [group], spec.page_size_bytes * layers * blocks)
    attn = [[AttentionGroup(backend=backend_of(case), layer_names=names, kv_cache_spec=spec, kv_cache_group_id=0)]]
    kernel = prepare_kernel_block_sizes(kv_cache_config, attn)
    kv_caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), resolved, kernel)
    fill(kv_caches)
    return kv_caches, kv_cache_config, config


def backing(kv_caches: dict[str, torch.Tensor]) -> torch.Tensor:
    first = next(iter(kv_caches.values()))
    return torch.empty(0, dtype=torch.uint8).set_(first.untyped_storage())


def fill(kv_caches: dict[str, torch.Tensor]) -> None:
    raw = backing(kv_caches)
    raw.copy_(torch.randint(0, 256, (raw.numel(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(11)))
