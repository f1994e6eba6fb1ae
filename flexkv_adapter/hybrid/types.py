"""The records a hybrid wrapper is described by, and the error that refuses one (no logic here).

Kept apart from detection (:mod:`.hybrid`) and the policy (:mod:`.hybrid_policy`) so both can use them
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import UnsupportedPoolError

HybridMode = Literal["error", "attention_only"]


class HybridPoolError(UnsupportedPoolError):
    """A hybrid pool, refused by default: FlexKV would receive only part of the model's state."""


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


__all__ = ["HybridMode", "HybridPoolError", "HybridStructure", "SideGroup"]
