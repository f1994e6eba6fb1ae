"""``FlexKVConnectorV1Impl`` as FlexKV 34ab141 builds it (integration/vllm/vllm_v1_adapter.py)."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from flexkv.common.storage import KVCacheLayout, KVCacheLayoutType
from flexkv.integration.config import FlexKVConfig
from flexkv.server.client import KVTPClient

SCHEDULERS: list = []


class FlexKVSchedulerConnector:
    def __init__(self, flexkv_config, rank_info):
        self.flexkv_config = flexkv_config  # FlexKV starts its KVManager with rank_info.model_config here
        SCHEDULERS.append(self)


class FlexKVWorkerConnector:
    def __init__(self, flexkv_config, rank_info):
        self.flexkv_config = flexkv_config
        self.tp_client = KVTPClient(flexkv_config.gpu_register_port, device_id=rank_info.local_rank)

    def register_to_server(self, kv_caches, *, resume=False):
        # FlexKV's guess for a 4-D tensor: packed [blocks, heads, tokens, width], one tensor per layer,
        # heads per rank as num_kv_heads, head-major refused unless heads or tokens is 1.
        tensors = [t for n, t in kv_caches.items() if ".k_cache" not in n]
        first = tensors[0]
        if first.ndim != 4 or self.flexkv_config.model_config.kv_dim != 1:
            raise ValueError(
                f"unsupported cache shape={tuple(first.shape)} kv_dim={self.flexkv_config.model_config.kv_dim}"
            )
        if first.shape[1] > 1 and first.shape[2] > 1 and first.stride(1) > first.stride(2):
            raise ValueError("KV cache is head-major (HND)")
        layout = KVCacheLayout(
            type=KVCacheLayoutType.LAYERFIRST,
            num_layer=len(tensors),
            num_block=first.shape[0],
            tokens_per_block=first.shape[2],
            num_head=first.shape[1],
            head_size=first.shape[3],
            kv_dim=1,
            num_kv_heads=first.shape[1],
        )
        self.tp_client.register_to_server(kv_caches=tensors, kv_layout=layout, resume=resume)
        self._registered_kv_caches = dict(kv_caches)


class FlexKVConnectorV1Impl:
    def __init__(self, vllm_config, role):
        self.role = role
        flexkv_config = FlexKVConfig.from_env()
        rank_info = flexkv_config.post_init_from_vllm_config(vllm_config)
        if role == KVConnectorRole.SCHEDULER:
            self.connector = FlexKVSchedulerConnector(flexkv_config, rank_info)
        else:
            self.connector = FlexKVWorkerConnector(flexkv_config, rank_info)

    def register_kv_caches(self, kv_caches):
        self.connector.register_to_server(kv_caches)

    def after_device_wake(self):
        self.connector.register_to_server(self.connector._registered_kv_caches, resume=True)

    def shutdown(self):
        pass
