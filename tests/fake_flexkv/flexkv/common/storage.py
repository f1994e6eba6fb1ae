"""FlexKV's KVCacheLayoutType / KVCacheLayout as documented (flexkv/common/storage.py:22-150)."""

from dataclasses import dataclass
from enum import Enum


class KVCacheLayoutType(Enum):
    LAYERFIRST = "LAYERFIRST"
    BLOCKFIRST = "BLOCKFIRST"
    LAYERBLOCK = "LAYERBLOCK"


@dataclass
class KVCacheLayout:
    type: KVCacheLayoutType
    num_layer: int
    num_block: int
    tokens_per_block: int
    num_head: int
    head_size: int
    kv_dim: int = 2
    num_kv_heads: int = 1
    _kv_shape: tuple | None = None
    layer_groups: list | None = None
    tp_size: int = 1

    @property
    def kv_shape(self):
        t = (self.tokens_per_block, self.num_head, self.head_size)
        if self.type == KVCacheLayoutType.LAYERFIRST:
            return (self.num_layer, self.kv_dim, self.num_block, *t)
        if self.type == KVCacheLayoutType.BLOCKFIRST:
            return (self.num_block, self.num_layer, self.kv_dim, *t)
        return (self.num_layer, self.num_block, self.kv_dim, *t)

    def get_chunk_size(self):
        return self.tokens_per_block * self.num_head * self.head_size
