"""Layout descriptions: what is known about a pool, and one reading of its tensors.

`Geometry` gathers the facts that constrain the reading (from the pool's own metadata and from
explicit options). `Interpretation` is one candidate meaning of the located tensors' axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch

from .axes import Axis, format_axes

ViewKind = Literal["mha", "mla"]
Plane = Literal["k", "v", "kv"]


@dataclass(frozen=True)
class Geometry:
    """Known facts about a pool; ``None`` means unknown (unconstrained)."""

    layer_num: int | None = None
    head_num: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    kv_dim: int | None = None
    page_size: int | None = None
    start_layer: int = 0
    kind: ViewKind | None = None
    axes: tuple[Axis, ...] | None = None
    attrs: tuple[str, ...] | None = None
    layer_ids: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    sources: tuple[tuple[str, str], ...] = ()
    given: frozenset[str] = frozenset()

    def expected_dim(self, plane: Plane) -> int | None:
        return {"k": self.head_dim, "v": self.v_head_dim, "kv": self.kv_dim}[plane]

    def origin(self, name: str) -> str:
        """Where a fact came from ("option" or "pool.<attr>"), for messages."""
        return dict(self.sources).get(name, "option")


@dataclass(frozen=True)
class Interpretation:
    """One reading of the located tensors: view kind, axes of each tensor, container shape."""

    kind: ViewKind
    axes: tuple[Axis, ...]
    per_layer: bool

    @cached_property
    def axes_text(self) -> str:
        return format_axes(self.axes)

    @property
    def planes(self) -> tuple[Plane, ...]:
        return ("kv",) if self.kind == "mla" else ("k", "v")

    def __str__(self) -> str:
        shape = f"per-layer [{self.axes_text}]" if self.per_layer else f"[{self.axes_text}]"
        return f"{self.kind.upper()} {shape}"
