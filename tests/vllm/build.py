"""Build KV cache dicts with vLLM's own code (0.32 or 0.33): spec -> layout -> config -> kernel blocks -> views."""

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

    try:  # vLLM 0.33 moved it out of kv_cache_utils (0.32)
        from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
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
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]  # LAYER_NAMES for 3
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


LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(3)]


def connector_config(model_dir: Any, case: str, tp_size: int = 1) -> Any:
    """A real VllmConfig selecting FlexKVConnectorV1, for a tiny Llama-shaped model of 3 layers.

    Its attention layers stand in for the model's (no model is loaded on CPU) and report the real
    backend class of ``case``, which is what FlexKV's construction asks for its cache shape.
    """
    import json

    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    spec = spec_of(case)
    heads = spec.num_kv_heads * tp_size
    (model_dir / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 4 * heads * spec.head_size,
                "head_dim": spec.head_size,
                "num_attention_heads": 4 * heads,
                "num_key_value_heads": heads,
                "num_hidden_layers": len(LAYER_NAMES),
                "intermediate_size": 64,
                "vocab_size": 256,
                "max_position_embeddings": 512,
                "torch_dtype": "bfloat16",
            }
        )
    )
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16")
    config = vllm_config(
        tp_size,
        model_config=model,
        cache_config=CacheConfig(block_size=spec.block_size),
        kv_transfer_config=KVTransferConfig(kv_connector="FlexKVConnectorV1", kv_role="kv_both"),
    )
    backend = backend_of(case)

    class Layer(AttentionLayerBase):
        def get_attn_backend(self) -> Any:
            return backend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return spec

    for name in LAYER_NAMES:
        config.compilation_config.static_forward_context[name] = Layer()
    return config
