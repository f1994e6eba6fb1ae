"""The axis vocabulary of KV-cache tensors and the parser for axis strings.

A layout is a tuple of axes, outermost first, e.g. ``"L KV N H D"`` for one tensor holding every
layer. ``N`` is a flat token (row) axis; ``P`` and ``T`` are a page axis and the token-in-page axis,
which together form the rows. A missing ``H`` means one head (MLA latent rows).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum


class Axis(str, Enum):
    """Meaning of one tensor axis."""

    LAYER = "L"
    KV = "KV"
    ROWS = "N"
    PAGE = "P"
    TOKEN = "T"
    HEAD = "H"
    DIM = "D"

    def __str__(self) -> str:
        return self.value


AxesLike = str | Sequence[str] | Sequence[Axis]


def parse_axes(axes: AxesLike) -> tuple[Axis, ...]:
    """Parse ``"L KV N H D"`` / ``"L,KV,N,H,D"`` / a sequence into validated axes."""
    items = re.split(r"[\s,]+", axes.strip()) if isinstance(axes, str) else list(axes)
    try:
        parsed = tuple(Axis(str(a).upper()) for a in items if str(a))
    except ValueError as exc:
        names = " ".join(a.value for a in Axis)
        raise ValueError(f"unknown axis in {axes!r}; axes are {names}") from exc
    if len(set(parsed)) != len(parsed):
        raise ValueError(f"axes {format_axes(parsed)!r} name an axis twice")
    if Axis.DIM not in parsed:
        raise ValueError(f"axes {format_axes(parsed)!r} lack the D (head dim) axis")
    paged = Axis.PAGE in parsed, Axis.TOKEN in parsed
    if (Axis.ROWS in parsed) == any(paged) or paged[0] != paged[1]:
        raise ValueError(f"axes {format_axes(parsed)!r} need either N, or both P and T, for the rows")
    return parsed


def format_axes(axes: Sequence[Axis]) -> str:
    return " ".join(a.value for a in axes)
