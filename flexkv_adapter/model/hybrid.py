"""The records a hybrid wrapper and a pool offloaded whole are described by, and the errors that refuse them.

Below both their reader (:mod:`~flexkv_adapter.readers.wrappers`) and the policy
(:func:`~flexkv_adapter.pipeline.build.apply_policy`), so each uses them without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from ..errors import UnsupportedPoolError
from .layer_group import Group

if TYPE_CHECKING:
    from .views import PoolView

HybridMode = Literal["error", "attention_only"]

# Tables SGLang derives from the planes (pointer and stride arrays for its kernels): not state.
DERIVED = frozenset({"data_ptrs", "k_data_ptrs", "v_data_ptrs", "data_strides", "kv_data_ptrs"})
# Layer ids (read as ids by readers.wrappers and pipeline.metadata): metadata, not page-indexed state.
LAYER_METADATA = frozenset(
    {
        "model_layer_ids",
        "mamba_layer_ids",
        "layers_mapping",
        "full_attention_layer_id_mapping",
        "index_kv_layer_id_mapping",
        "index_k_layer_id_mapping",
        "sparse_layer_id_mapping",
    }
)


class HybridPoolError(UnsupportedPoolError):
    """A hybrid pool, refused by default: FlexKV would receive only part of the model's state."""


class PartialPoolError(UnsupportedPoolError):
    """Part of the pool cannot be registered with the KV's page ids: FlexKV could store only the rest."""


@dataclass(frozen=True)
class SideGroup:
    """Pool memory besides the primary buffers, exposed zero-copy (FlexKV does not receive it)."""

    name: str
    tensors: tuple[torch.Tensor, ...]
    layer_ids: tuple[int, ...]
    index_space: str  # "token", "swa_token", "mamba_slot", "page"
    reason: str

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def describe(self) -> str:
        first = self.tensors[0] if self.tensors else None
        what = (
            f"{len(self.tensors)} x {tuple(first.shape)} {str(first.dtype).removeprefix('torch.')}"
            if first is not None
            else "no tensors found"
        )
        return f"{self.name}: {what}, layers {list(self.layer_ids)}, index space {self.index_space} ({self.reason})"


@dataclass(frozen=True)
class HybridStructure:
    family: str
    primary_attr: str
    primary: object
    layer_ids: tuple[int, ...] | None
    side_groups: tuple[SideGroup, ...]
    backing: tuple[tuple[int, str, object], ...]  # (global layer id, sub-pool attribute, sub-pool)


@dataclass(frozen=True)
class Plane:
    """One layer group beside the KV: tensors indexed by the KV's page ids, block b at ``b * chunk`` bytes."""

    name: str
    tensors: tuple[torch.Tensor, ...]  # K list then V list when ``kv``; 2-D [rows, row elements], zero-copy
    layer_ids: tuple[int, ...]  # the model's layer ids (one per layer; K and V share theirs)
    num_heads: int
    head_size: int  # per token, in elements of ``dtype``
    dtype: torch.dtype
    compress_ratio: int  # page tokens per stored token (DSA kpool); 1 = one entry per token
    rows_per_block: int  # tensor rows per page: page_size for token-indexed planes, 1 for page-indexed
    kv: bool

    def chunk_bytes(self, page_size: int) -> int:
        """Bytes of one (layer, kv, page) chunk of this plane, as FlexKV's group of it copies them."""
        return page_size // self.compress_ratio * self.num_heads * self.head_size * self.dtype.itemsize

    def group(self, page_size: int) -> Group:
        """This plane as the gate checks a registered layer group."""
        per_layer, chunk = 2 if self.kv else 1, self.chunk_bytes(page_size)
        group = Group(self.name, self.tensors, self.layer_ids, per_layer, chunk_bytes=chunk)
        return group._replace(rows_per_block=self.rows_per_block, compress_ratio=self.compress_ratio)


@dataclass(frozen=True)
class LeftOut:
    """Pool memory deliberately not registered, and why that loses nothing."""

    name: str
    reason: str


@dataclass(frozen=True)
class WholePool:
    """The planes of a pool FlexKV can offload whole, beside the primary KV, and what they leave out."""

    family: str
    planes: tuple[Plane, ...]
    left_out: tuple[LeftOut, ...] = ()

    def groups(self, view: PoolView) -> list[Group]:
        """The KV and every plane as the gate's groups, with what FlexKV will read of each (one block's bytes)."""
        first, page = view.tensors()[0], view.page_size
        kv_chunk = page * first[0].numel() * first.element_size()
        kv = Group("KV", tuple(view.tensors()), tuple(view.layer_ids), 2 if view.kind == "mha" else 1)
        kv = kv._replace(chunk_bytes=kv_chunk, rows_per_block=page)
        return [kv, *(p.group(page) for p in self.planes)]

    def describe(self) -> str:
        planes = "; ".join(f"{p.name} ({len(p.tensors)} tensors, layers {list(p.layer_ids)})" for p in self.planes)
        left = "".join(f"; left out: {x.name} ({x.reason})" for x in self.left_out)
        return f"offloaded whole ({self.family}) as FlexKV layer groups: KV, {planes}{left}"


__all__ = [
    "DERIVED",
    "LAYER_METADATA",
    "HybridMode",
    "HybridPoolError",
    "HybridStructure",
    "LeftOut",
    "PartialPoolError",
    "Plane",
    "SideGroup",
    "WholePool",
]
