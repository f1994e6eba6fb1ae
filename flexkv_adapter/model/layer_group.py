"""The record the gate checks: tensors headed to FlexKV as one layer group (or one part of the KV).

Below the gate (:mod:`flexkv_adapter.gate`) and the readers that build groups as they read
(:mod:`~flexkv_adapter.readers.planes`), which are handed the gate's :func:`~flexkv_adapter.gate.admit`
as an :data:`Admit` rather than import a stage above their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch


class Group(NamedTuple):
    """Tensors headed to FlexKV as one layer group (or one part of the KV). Immutable; a named tuple, not a
    dataclass, because every adapt() builds one per plane and a frozen dataclass costs a microsecond more."""

    name: str
    tensors: tuple[torch.Tensor, ...]
    layer_ids: tuple[int, ...] | None  # None: the count is not known yet
    per_layer: int = 1  # tensors per layer: 2 = a K list then a V list
    again: Callable[[], object] | None = None  # a second read of the attribute(s) the tensors came from
    chunk_bytes: int | None = None  # bytes of one block of one tensor, once the registration is known
    rows_per_block: int = 1
    compress_ratio: int = 1


class Admit(Protocol):
    """:func:`~flexkv_adapter.gate.admit`'s signature: the warnings, or an AdapterError naming the rule."""

    def __call__(
        self, where: str, groups: Sequence[Group], *, blocks: int | None = None, page: int | None = None
    ) -> list[str]: ...


__all__ = ["Admit", "Group"]
