"""``FlexKVConfig``: how FlexKV 34ab141 derives its model layout from a vLLM config (integration/config.py)."""

from types import SimpleNamespace

import torch


class FlexKVConfig:
    def __init__(self):
        self.model_config = SimpleNamespace(
            num_layers=0, num_kv_heads=0, head_size=0, kv_dim=2, tp_size=1, dtype=torch.bfloat16, dp_size=1, nnodes=1
        )
        self.cache_config = SimpleNamespace(
            tokens_per_block=16, enable_kv_sharing=False, enable_remote=False, enable_gds=False
        )
        self.gpu_register_port = "ipc:///tmp/fake_flexkv_gpu_register"
        self.server_recv_port = "ipc:///tmp/fake_flexkv_server_recv"

    @classmethod
    def from_env(cls):
        return cls()

    def post_init_from_vllm_config(self, vllm_config):
        self.cache_config.tokens_per_block = vllm_config.cache_config.block_size
        self.model_config.num_layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        self.model_config.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self._configure_kv_layout_from_vllm_backend(vllm_config, vllm_config.cache_config.cache_dtype)
        from flexkv.common.config import RankInfo

        return RankInfo(model_config=self.model_config)

    def _configure_kv_layout_from_vllm_backend(self, vllm_config, vllm_kv_cache_dtype):
        # FlexKV asks the backend for one block's cache shape; vLLM 0.33 backends lack the method.
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backend

        heads = vllm_config.model_config.get_num_kv_heads(vllm_config.parallel_config)
        with set_current_vllm_config(vllm_config):
            shape = get_current_attn_backend(vllm_config).get_kv_cache_shape(
                1,
                self.cache_config.tokens_per_block,
                heads,
                vllm_config.model_config.get_head_size(),
                vllm_kv_cache_dtype,
            )
        kv_dim = 2 if len(shape) == 5 else 1
        per_rank = 1 if len(shape) == 3 else shape[-2 if len(shape) == 5 else 1]
        self.model_config.num_kv_heads = per_rank if len(shape) == 3 else per_rank * self.model_config.tp_size
        self.model_config.head_size, self.model_config.kv_dim = shape[-1], kv_dim
