"""``FlexKVConnectorV1Impl`` as FlexKV 34ab141 builds it (integration/vllm/vllm_v1_adapter.py).

The scheduler side (task maps, polling, failures, reset) is in ``scheduler_side.py``; this module
keeps the real module's names: the stats types, the worker connector and the V1 implementation.
"""

import os

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from flexkv.common.storage import KVCacheLayout, KVCacheLayoutType
from flexkv.integration.config import FlexKVConfig
from flexkv.integration.vllm.scheduler_side import FlexKVSchedulerConnector
from flexkv.server.client import KVTPClient


class _FlexKVConnectorStats(KVConnectorStats):  # adp:29-60
    _RATIO_KEYS = frozenset({"get_gpu_match_ratio", "get_flexkv_match_ratio"})

    def reset(self):
        for key in self.data:
            self.data[key] = 0

    def aggregate(self, other):
        for key, value in other.data.items():
            if key not in self._RATIO_KEYS:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(v for k, v in self.data.items() if k not in self._RATIO_KEYS)


class _FlexKVWorkerSentinelStats(KVConnectorStats):  # adp:62-81: keeps the worker's output non-empty
    def aggregate(self, other):
        return other

    def reduce(self):
        return {}

    def reset(self):
        pass

    def is_empty(self):
        return True


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

    def before_device_sleep(self):
        return self.tp_client.suspend_gpu_mappings()

    def after_device_wake(self):
        if not hasattr(self, "_registered_kv_caches"):
            raise RuntimeError("KV caches were not registered before wake")
        self.register_to_server(self._registered_kv_caches, resume=True)


class FlexKVConnectorV1Impl:
    def __init__(self, vllm_config, role):
        self.role = role
        flexkv_config = FlexKVConfig.from_env()
        rank_info = flexkv_config.post_init_from_vllm_config(vllm_config)
        if role == KVConnectorRole.SCHEDULER:
            self.connector = FlexKVSchedulerConnector(flexkv_config, rank_info)
            self.previous_scheduled_req_ids = set()
        else:
            self.connector = FlexKVWorkerConnector(flexkv_config, rank_info)

    def shutdown(self):
        if self.role == KVConnectorRole.SCHEDULER:
            self.connector.shutdown()

    def reset_cache(self):
        return self.connector.reset_cache() if self.role == KVConnectorRole.SCHEDULER else None

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        return None, None

    def register_kv_caches(self, kv_caches):
        self.connector.register_to_server(kv_caches)

    def before_device_sleep(self):
        if self.role == KVConnectorRole.WORKER:
            self.connector.before_device_sleep()

    def after_device_wake(self):
        if self.role == KVConnectorRole.WORKER:
            self.connector.after_device_wake()

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.connector.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.connector.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):  # adp:1159-1197
        preempted = getattr(scheduler_output, "preempted_req_ids", None)
        if preempted:
            self.connector.handle_preemptions(preempted)
        self.connector.cancel_tasks()
        self.connector.launch_tasks()
        if os.getenv("FLEXKV_SYNC_GET", "0") == "1":
            self.connector.wait_for_all_get_tasks()
        return KVConnectorMetadata()

    def update_connector_output(self, connector_output):  # adp:1199-1206: overwrites vLLM's sets
        finished_sending, finished_recving = self.connector.query_finished_task()
        connector_output.finished_sending = finished_sending
        connector_output.finished_recving = finished_recving

    def request_finished(self, request, block_ids):
        return self.connector.request_finished(request, block_ids), None

    def take_events(self):
        return []

    def get_kv_connector_stats(self):
        if self.role != KVConnectorRole.SCHEDULER:
            return _FlexKVWorkerSentinelStats(data={})
        stats = self.connector.flexkv_stats
        names = (
            "num_get_requests",
            "num_get_query_tokens",
            "num_gpu_matched_tokens",
            "num_flexkv_matched_tokens",
            "num_put_requests",
            "num_put_query_tokens",
            "num_put_unmatched_tokens",
            "num_failed_requests",
            "get_gpu_match_ratio",
            "get_flexkv_match_ratio",
        )
        return _FlexKVConnectorStats(data={n: getattr(stats, n) for n in names})

    def get_block_ids_with_load_errors(self):
        if self.role == KVConnectorRole.SCHEDULER:
            return self.connector.get_and_clear_failed_block_ids()
        return set()
