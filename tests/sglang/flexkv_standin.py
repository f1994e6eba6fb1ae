"""A stand-in for FlexKV's Python surface as SGLang's connectors use it (FlexKV cannot be installed here).

Two API shapes, written from FlexKV's code (no code copied):

* ``old``: b70205e, what SGLang 0.5.23's in-tree connector was written for:
  ``KVTPClient.register_to_server(kv_caches, kv_layout, override_device_id=, indexer_buffers=,
  indexer_layout=)``, ``KVCacheLayout(..., is_mla)``, ``ModelConfig.use_mla``; MLA-ness from
  ``attention_arch == MLA``.
* ``current``: 34ab141: ``register_to_server(kv_caches, kv_layout, override_device_id=, layer_groups=,
  ...)``, ``KVCacheLayout(..., kv_dim=, num_kv_heads=)``, ``ModelConfig.kv_dim``; MLA-ness from
  ``qk_nope_head_dim``; FlexKV's own ``flexkv.integration.sglang.connector.FlexKVConnector``.

:func:`build_tree` writes an importable ``flexkv`` package of one shape whose modules re-export
these classes, so module lookups (``find_spec``) behave as with a real install. Every call that
crosses into FlexKV is appended to :data:`CALLS`. Left out on purpose: the CUDA check of
``register_to_server`` (tests run on CPU), the sockets behind it, and ``ModelConfig.freeze()``'s
"total GPUs divisible by nnodes" check (a two-node TP group needs ranks one process cannot hold;
the node-1 tests run one rank with ``nnodes=2``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

CALLS: list[tuple[str, dict[str, Any]]] = []


def calls(name: str) -> list[dict[str, Any]]:
    return [kw for n, kw in CALLS if n == name]


class KVResponseStatus(Enum):
    SUCCESS = "success"
    NOT_FOUND = "not_found"
    FAILED = "failed"


class KVCacheLayoutType(Enum):
    LAYERFIRST = "LAYERFIRST"
    BLOCKFIRST = "BLOCKFIRST"
    LAYERBLOCK = "LAYERBLOCK"


@dataclass
class OldKVCacheLayout:
    type: KVCacheLayoutType
    num_layer: int
    num_block: int
    tokens_per_block: int
    num_head: int
    head_size: int
    is_mla: bool
    _kv_shape: Any = None

    @property
    def kv_dim(self) -> int:
        return 1 if self.is_mla else 2


@dataclass
class CurrentKVCacheLayout:
    type: KVCacheLayoutType
    num_layer: int
    num_block: int
    tokens_per_block: int
    num_head: int
    head_size: int
    kv_dim: int = 2
    num_kv_heads: int = 1
    _kv_shape: Any = None
    layer_groups: Any = None
    tp_size: int = 1


def layout_fields(layout: Any) -> dict[str, Any]:
    """The fields ``tests.helpers.flexkv_worker_read`` takes."""
    names = ("num_layer", "num_block", "kv_dim", "tokens_per_block", "num_head", "head_size")
    return {"type": layout.type.value, **{n: getattr(layout, n) for n in names}}


@dataclass
class _ModelConfigBase:
    num_layers: int = 1
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: torch.dtype = torch.bfloat16
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    attn_cp_size: int = 1
    nnodes: int = 1
    master_host: str = "localhost"
    master_ports: tuple[str, ...] = ("5556", "5557", "5558")

    @property
    def attn_tp_size(self) -> int:
        return self.tp_size


@dataclass
class OldModelConfig(_ModelConfigBase):
    use_mla: bool = False


@dataclass
class CurrentModelConfig(_ModelConfigBase):
    kv_dim: int = 2


@dataclass
class CacheConfig:
    tokens_per_block: int = 16
    num_cpu_blocks: int = 64
    num_ssd_blocks: int = 0
    num_remote_blocks: int = 0
    enable_ssd: bool = False
    enable_remote: bool = False
    enable_kv_sharing: bool = False


@dataclass
class RankInfo:
    model_config: Any
    pp_rank: int
    attn_tp_rank: int
    attn_cp_rank: int
    node_rank: int
    pp_start_layer: int
    pp_end_layer: int
    local_rank: int = 0
    dp_client_id: int = 0
    pp_size_per_node: int = 1

    @property
    def num_layers_per_pp_stage(self) -> int:
        return self.pp_end_layer - self.pp_start_layer


class FlexKVConfig:
    """``FlexKVConfig.from_env()`` + ``post_init_from_sglang_config`` (the facts the connectors use)."""

    shape = "current"

    def __init__(self) -> None:
        self.model_config: Any = (OldModelConfig if self.shape == "old" else CurrentModelConfig)()
        self.cache_config = CacheConfig()
        self.server_recv_port = "ipc:///tmp/flexkv_standin_server"
        self.gpu_register_port = "ipc:///tmp/flexkv_standin_server_gpu_register"

    @classmethod
    def from_env(cls) -> FlexKVConfig:
        return cls()

    def post_init_from_sglang_config(
        self, sglang_config, server_args, page_size=64, tp_rank=0, pp_rank=0, dp_rank=0, attn_cp_rank=0
    ) -> RankInfo:
        from sglang.srt.distributed.utils import get_pp_indices

        mc = self.model_config
        self.cache_config.tokens_per_block = page_size
        mc.num_layers = int(getattr(sglang_config, "num_hidden_layers", 0))
        if self.shape == "old":
            mla = getattr(getattr(sglang_config, "attention_arch", None), "name", None) == "MLA"
            mc.use_mla = mla
        else:
            mla = hasattr(sglang_config, "qk_nope_head_dim")
            mc.kv_dim = 1 if mla else 2
        if mla:
            mc.num_kv_heads = 1
            mc.head_size = int(sglang_config.kv_lora_rank) + int(sglang_config.qk_rope_head_dim)
        else:
            mc.num_kv_heads = int(sglang_config.get_total_num_kv_heads())
            mc.head_size = int(sglang_config.head_dim)
        mc.tp_size, mc.pp_size = int(server_args.tp_size), int(server_args.pp_size)
        mc.nnodes = max(1, int(server_args.nnodes))
        addr = getattr(server_args, "dist_init_addr", None)
        mc.master_host = addr.split(":")[0] if addr and mc.nnodes > 1 else os.getenv("FLEXKV_MASTER_HOST", "localhost")
        mc.master_ports = tuple(os.getenv("FLEXKV_MASTER_PORTS", "5556,5557,5558").split(","))
        start, end = get_pp_indices(mc.num_layers, pp_rank, mc.pp_size) if mc.pp_size > 1 else (0, mc.num_layers)
        return RankInfo(mc, pp_rank, tp_rank % mc.tp_size, attn_cp_rank, int(server_args.node_rank), start, end)


class OldFlexKVConfig(FlexKVConfig):
    shape = "old"


class KVManager:
    def __init__(self, **kwargs: Any) -> None:
        CALLS.append(("KVManager", kwargs))

    def start(self) -> None:
        pass

    def is_ready(self) -> bool:
        return True

    def shutdown(self) -> None:
        CALLS.append(("KVManager.shutdown", {}))


class _KVTPClient:
    def __init__(self, gpu_register_port: str, dp_client_id: int = 0, pp_rank: int = 0, **kwargs: Any) -> None:
        self.gpu_register_port, self.dp_client_id, self.pp_rank = gpu_register_port, dp_client_id, pp_rank


class OldKVTPClient(_KVTPClient):
    def register_to_server(self, kv_caches, kv_layout, override_device_id=None, indexer_buffers=None,
                           indexer_layout=None):  # fmt: skip
        record = dict(indexer_buffers=indexer_buffers, indexer_layout=indexer_layout)
        CALLS.append(("register_to_server", dict(kv_caches=list(kv_caches), kv_layout=kv_layout, **record)))


class CurrentKVTPClient(_KVTPClient):
    """34ab141's signature (its swa_* keywords, unused by these connectors' standard path, left out)."""

    def register_to_server(self, kv_caches, kv_layout, override_device_id=None, layer_groups=None,
                           gpu_layouts=None, handles_per_group=None, resume=False):  # fmt: skip
        CALLS.append(("register_to_server", dict(kv_caches=list(kv_caches), kv_layout=kv_layout)))


def build_layerwise_eventfd_socket_path(dp_client_id: int, pp_rank: int, model_config: Any) -> str:
    return f"/tmp/flexkv_standin_layerwise_{dp_client_id}_{pp_rank}.sock"


class SpawnedRemote:
    """What FlexKV's ``create_process`` returns (its SubprocessWrapper has no ``kill``)."""

    pid = 4242

    def is_alive(self) -> bool:
        return False

    def terminate(self) -> None:
        CALLS.append(("SpawnedRemote.terminate", {}))

    def join(self, timeout: float | None = None) -> None:
        pass


class TransferManagerOnRemote:
    @classmethod
    def create_process(cls, **kwargs: Any) -> SpawnedRemote:
        CALLS.append(("create_process", kwargs))  # FlexKV would Popen a second remote here
        return SpawnedRemote()


class OwnFlexKVConnector:
    """FlexKV's own SGLang connector (current shape), reduced to what reaches FlexKV at construction."""

    def __init__(self, *, sgl_model_config, server_args, page_size, kvcache, tp_rank, dp_rank, pp_rank,
                 attn_cp_rank, pp_group=None, attn_tp_group=None, attn_cp_group=None):  # fmt: skip
        self.page_size = int(page_size)
        config = FlexKVConfig.from_env()
        self.rank_info = config.post_init_from_sglang_config(
            sgl_model_config, server_args, self.page_size, tp_rank, pp_rank, dp_rank or 0, attn_cp_rank
        )
        mc = config.model_config
        if getattr(kvcache, "c4_kv_pool", None) is None and hasattr(kvcache, "kv_buffer"):
            kv_caches = list(kvcache.kv_buffer)
        elif hasattr(kvcache, "k_buffer"):
            kv_caches = list(kvcache.k_buffer) + list(kvcache.v_buffer)
        else:
            raise AttributeError(f"Unsupported KV cache type {type(kvcache).__name__}")
        self._remote_process = None
        if mc.nnodes > 1 and self.rank_info.node_rank > 0 and self.rank_info.local_rank == 0:
            self._remote_process = TransferManagerOnRemote.create_process(
                master_host=mc.master_host, master_ports=mc.master_ports
            )
        rows, heads, head_size = kv_caches[0].shape
        layout = CurrentKVCacheLayout(
            KVCacheLayoutType.LAYERFIRST,
            self.rank_info.num_layers_per_pp_stage,
            rows // self.page_size,
            self.page_size,
            heads,
            head_size,
            mc.kv_dim,
            heads,
        )
        CurrentKVTPClient(config.gpu_register_port).register_to_server(kv_caches=kv_caches, kv_layout=layout)

    def shutdown(self) -> None:
        if self._remote_process is not None:
            self._remote_process.terminate()
            self._remote_process.join(timeout=5.0)
            if self._remote_process.is_alive():
                self._remote_process.kill()
            self._remote_process = None


_COMMON = {
    "flexkv/common/request.py": "KVResponseStatus",
    "flexkv/kvmanager.py": "KVManager",
    "flexkv/transfer/layerwise.py": "build_layerwise_eventfd_socket_path",
    "flexkv/transfer_manager.py": "TransferManagerOnRemote",
}
_SHAPES = {
    "old": {
        "flexkv/common/storage.py": "OldKVCacheLayout as KVCacheLayout, KVCacheLayoutType",
        "flexkv/common/config.py": "OldModelConfig as ModelConfig",
        "flexkv/integration/config.py": "OldFlexKVConfig as FlexKVConfig",
        "flexkv/server/client.py": "OldKVTPClient as KVTPClient",
    },
    "current": {
        "flexkv/common/storage.py": "CurrentKVCacheLayout as KVCacheLayout, KVCacheLayoutType",
        "flexkv/common/config.py": "CurrentModelConfig as ModelConfig",
        "flexkv/integration/config.py": "FlexKVConfig",
        "flexkv/server/client.py": "CurrentKVTPClient as KVTPClient",
        "flexkv/integration/sglang/connector.py": "OwnFlexKVConnector as FlexKVConnector",
    },
}


def build_tree(root: Path, shape: str) -> Path:
    """Write an importable ``flexkv`` package of ``shape`` under ``root``; returns ``root`` (for sys.path)."""
    for rel, names in {**_COMMON, **_SHAPES[shape]}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"from tests.sglang.flexkv_standin import {names}  # noqa: F401\n")
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                (root / parent / "__init__.py").touch()
    return root


@dataclass
class ServerArgs:
    """The ServerArgs fields FlexKV's config reads (a real ServerArgs needs a GPU to validate)."""

    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    enable_dp_attention: bool = False
    attn_cp_size: int = 1
    kv_cache_dtype: str = "auto"
    dist_init_addr: str | None = None
