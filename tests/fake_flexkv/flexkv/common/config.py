"""FlexKV's LayerGroupSpec as documented (flexkv/common/config.py:33-65 at 34ab141)."""

from dataclasses import dataclass


@dataclass
class LayerGroupSpec:
    num_layers: int
    num_kv_heads: int
    head_size: int
    layer_indices: list
    dtype: object = None
    compress_ratio: int = 1
