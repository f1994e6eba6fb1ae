"""FlexKV's layout types, addressing modes and the plan dataclass: data only, imported by every planner.

Split from :mod:`.plan` (which re-exports these names) so that the checks, the model rules and the
vLLM planner depend on the data, not on the planner: no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from math import prod
from typing import Any

import torch

from ..model.layout import ViewKind
from ._import import import_flexkv


class LayoutType(str, Enum):
    """FlexKV's ``KVCacheLayoutType`` values."""

    LAYERFIRST = "LAYERFIRST"
    BLOCKFIRST = "BLOCKFIRST"
    LAYERBLOCK = "LAYERBLOCK"


class AddressingMode(str, Enum):
    """FlexKV's GPU backend type, chosen by the number of registered tensors."""

    SGLANG = "SGLANG"  # 2 * num_layer tensors
    VLLM = "VLLM"  # num_layer tensors
    TRTLLM = "TRTLLM"  # one block-first tensor


@dataclass(frozen=True)
class GroupPlan:
    """One FlexKV layer group in the adapter's terms: its ``LayerGroupSpec``, GPU layout and tensors."""

    name: str
    tensors: tuple[torch.Tensor, ...]
    layer_indices: tuple[int, ...]  # FlexKV's: the model's layer ids, local to the pipeline stage
    num_head: int  # per rank
    head_size: int  # per token, elements of dtype
    dtype: torch.dtype
    compress_ratio: int
    tokens_per_block: int  # the KV's page size // compress_ratio
    num_block: int
    kv_dim: int  # group 0's, as FlexKV's worker uses it for every group

    @property
    def chunk_bytes(self) -> int:
        return self.tokens_per_block * self.num_head * self.head_size * self.dtype.itemsize

    def spec_fields(self) -> dict[str, Any]:
        """Keyword arguments of FlexKV's ``LayerGroupSpec``."""
        return {
            "num_layers": len(self.layer_indices),
            "num_kv_heads": self.num_head,
            "head_size": self.head_size,
            "layer_indices": list(self.layer_indices),
            "dtype": self.dtype,
            "compress_ratio": self.compress_ratio,
        }

    def layout_fields(self) -> dict[str, Any]:
        """Keyword arguments of this group's GPU ``KVCacheLayout`` (LAYERFIRST, like the KV's)."""
        return {
            "type": "LAYERFIRST",
            "num_layer": len(self.layer_indices),
            "num_block": self.num_block,
            "tokens_per_block": self.tokens_per_block,
            "num_head": self.num_head,
            "head_size": self.head_size,
            "kv_dim": self.kv_dim,
            "num_kv_heads": self.num_head,
        }


@dataclass(frozen=True)
class FlexKVPlan:
    """Everything FlexKV needs to register a pool: layout fields and tensors in its order."""

    type: LayoutType
    mode: AddressingMode
    num_layer: int
    num_block: int
    tokens_per_block: int
    num_head: int
    head_size: int
    kv_dim: int
    num_kv_heads: int
    tensors: tuple[torch.Tensor, ...]
    layer_ids: tuple[int, ...]
    dtype: torch.dtype
    kind: ViewKind  # what the tensors hold; kv_dim=1 is MLA or vLLM's packed [K | V] MHA cells
    groups: tuple[GroupPlan, ...] = ()  # a pool offloaded whole: group 0 is this KV, then its planes (groups.py)
    # the memory the gate admitted (:func:`sealed`): register() sends a plan only while its tensors are still that
    admitted: tuple[tuple[Any, ...], ...] = field(default=(), compare=False, repr=False)

    @property
    def kv_shape(self) -> tuple[int, ...]:
        """FlexKV's ``KVCacheLayout.kv_shape`` for this layout (elements)."""
        lay, blk, kv = self.num_layer, self.num_block, self.kv_dim
        tail = (self.tokens_per_block, self.num_head, self.head_size)
        return {
            LayoutType.LAYERFIRST: (lay, kv, blk, *tail),
            LayoutType.BLOCKFIRST: (blk, lay, kv, *tail),
            LayoutType.LAYERBLOCK: (lay, blk, kv, *tail),
        }[self.type]

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one (layer, kv, block) chunk: tokens_per_block * heads * head_size * itemsize."""
        return self.tokens_per_block * self.num_head * self.head_size * self.dtype.itemsize

    def strides(self) -> tuple[int, int, int]:
        """(layer, block, kv) strides in bytes, from the layout (5-D tensors must match them: checks.py)."""
        shape, item = self.kv_shape, self.dtype.itemsize
        dims = {LayoutType.LAYERFIRST: (1, 3, 2), LayoutType.BLOCKFIRST: (2, 1, 3), LayoutType.LAYERBLOCK: (1, 2, 3)}
        layer, block, kv = (prod(shape[d:]) * item for d in dims[self.type])
        return layer, block, kv

    def address(self, layer: int, kv: int, block: int) -> int:
        """The address FlexKV's worker reads for (layer, kv, block): its reference model."""
        layer_stride, block_stride, kv_stride = self.strides()
        if self.mode is AddressingMode.SGLANG:
            return self.tensors[kv * self.num_layer + layer].data_ptr() + block * block_stride
        if self.mode is AddressingMode.VLLM:
            return self.tensors[layer].data_ptr() + kv * kv_stride + block * block_stride
        return self.tensors[0].data_ptr() + block * block_stride + layer * layer_stride + kv * kv_stride

    def layout_fields(self) -> dict[str, Any]:
        """Keyword arguments of FlexKV's ``KVCacheLayout``."""
        return {
            "type": self.type.value,
            "num_layer": self.num_layer,
            "num_block": self.num_block,
            "tokens_per_block": self.tokens_per_block,
            "num_head": self.num_head,
            "head_size": self.head_size,
            "kv_dim": self.kv_dim,
            "num_kv_heads": self.num_kv_heads,
        }

    def to_flexkv(self) -> Any:
        """Build ``flexkv.common.storage.KVCacheLayout`` (needs FlexKV)."""
        storage = import_flexkv("flexkv.common.storage")
        fields = self.layout_fields()
        fields["type"] = storage.KVCacheLayoutType[self.type.value]
        return storage.KVCacheLayout(**fields)

    def flexkv_layer_groups(self) -> list[Any]:
        """FlexKV's ``LayerGroupSpec`` list the ``ModelConfig`` must carry (needs FlexKV; [] for one group)."""
        if not self.groups:
            return []
        config = import_flexkv("flexkv.common.config")
        return [config.LayerGroupSpec(**g.spec_fields()) for g in self.groups]

    def __str__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in self.layout_fields().items())
        extra = f", layer groups {[g.name for g in self.groups]}" if self.groups else ""
        return f"FlexKV {self.mode.value} mode, {len(self.tensors)} tensors, KVCacheLayout({fields}){extra}"


def memory_of(p: FlexKVPlan) -> tuple[tuple[Any, ...], ...]:
    """What register() would send, as memory: each tensor's address, shape, strides, dtype and storage size."""
    tensors = [t for g in p.groups for t in g.tensors] if p.groups else list(p.tensors)
    return tuple(_memory(t) for t in tensors)


def _memory(t: torch.Tensor) -> tuple[Any, ...]:
    try:
        size = t.untyped_storage().nbytes()
        return (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, size)
    except Exception as exc:  # not memory at all (meta, fake, sparse): it differs from anything admitted
        return (type(t).__name__, repr(exc))


def sealed(p: FlexKVPlan) -> FlexKVPlan:
    """``p`` with the memory the gate has just admitted recorded (plan() returns only sealed plans)."""
    return replace(p, admitted=memory_of(p))
