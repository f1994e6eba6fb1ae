"""``flexkv.common.config`` names the vLLM adapter imports (34ab141: LayerGroupSpec :33, RankInfo :431,
GLOBAL_CONFIG_FROM_ENV); only the fields it reads."""

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

GLOBAL_CONFIG_FROM_ENV = SimpleNamespace(instance_num=1, server_client_mode=False)


@dataclass
class LayerGroupSpec:
    num_layers: int
    num_kv_heads: int
    head_size: int
    layer_indices: list
    dtype: Any = None
    compress_ratio: int = 1


@dataclass
class RankInfo:
    model_config: Any
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0
    node_rank: int = 0
    instance_id: int = 0
    local_rank: int = 0
    dp_client_id: int = 0
    intra_client_id: int = 0
