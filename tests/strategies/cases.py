"""What a strategy draws for the adapt() properties: a :class:`Case`, and the check that holds a view to it.

A case is a tiny pool together with what a correct view must alias, so a test can hold adapt() to
"exactly the right elements, or an AdapterError": ``expected`` maps plane -> per-layer source regions
(None: any view is wrong, an error is due), ``must_succeed`` marks inputs that are fully specified and
FlexKV-addressable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from ..helpers import assert_aliases

DTYPE = torch.int32  # 4 bytes: FlexKV's 8-byte block rule bites when page * heads * dim is odd


@dataclass
class Case:
    pool: Any
    options: dict[str, Any]
    expected: dict[str, list[torch.Tensor]] | None
    roots: list[torch.Tensor]
    must_succeed: bool = False
    layer_ids: list[int] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def _ok(page: int, heads: int, *dims: int, itemsize: int = 4) -> bool:
    return all(page * heads * d * itemsize % 8 == 0 for d in dims)


def aligned_regions(expected: dict[str, list[torch.Tensor]], page: int) -> bool:
    """Every region's base meets FlexKV's kernel: 8-byte words, 16-byte loads when a block allows them."""
    return all(
        r.data_ptr() % (16 if page * r[0].numel() * r.element_size() % 16 == 0 else 8) == 0
        for regions in expected.values()
        for r in regions
    )


def check_view(view: Any, case: Case) -> None:
    """The view aliases exactly ``case.expected`` (values, then a write through the view)."""
    assert case.expected is not None, f"adapt accepted an input that must be refused: {case.notes}"
    planes = {"kv": view.kv_buffer} if view.report.kind == "mla" else {"k": view.k_buffer, "v": view.v_buffer}
    assert set(planes) == set(case.expected)
    rows = view.report.aligned_rows
    assert rows % view.page_size == 0 and view.report.bytes_copied == 0
    for plane, views in planes.items():
        assert len(views) == len(case.expected[plane])
        for got, region in zip(views, case.expected[plane]):
            region = region if region.ndim == 4 else region[:rows]  # paged regions are whole pages
            root = next(r for r in case.roots if r.untyped_storage().data_ptr() == got.untyped_storage().data_ptr())
            assert got.is_contiguous()
            if root.dtype == got.dtype:
                assert_aliases(got.view(region.shape), region, root)
            else:
                _assert_aliases_bytes(got.view(region.shape), region, root)
    if case.layer_ids is not None:
        assert view.layer_ids == case.layer_ids


def _assert_aliases_bytes(view: torch.Tensor, region: torch.Tensor, root: torch.Tensor) -> None:
    """``assert_aliases`` for a typed view of a byte root: the bytes a write changes lie in ``region``."""
    assert torch.equal(view, region)
    before = root.clone()
    view.fill_(-7 if view.dtype.is_signed else 7)
    assert torch.equal(region, torch.full_like(region, -7 if region.dtype.is_signed else 7))
    changed = (root != before).nonzero().flatten()
    start = region.data_ptr() - root.data_ptr()
    assert changed.numel() > 0 and start <= int(changed.min()) and int(changed.max()) < start + region.nbytes
    root.copy_(before)


def draw_geometry(draw: st.DrawFn) -> tuple[int, int, int, int]:
    heads, dim, page = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    rows = page * draw(st.integers(1, 3)) + draw(st.integers(0, page - 1))
    return heads, dim, page, rows
