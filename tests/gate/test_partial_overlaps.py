"""adapt()/plan(): views over shared bytes with a partial overlap, on the general path.

vLLM dicts refuse distinct views of the same bytes (HMA); per-layer lists and dicts only logged an overlap.
A layer starting a page into another layer (or V a page into K) makes a FlexKV restore of one block
overwrite a different block of the other: a block nobody asked it to touch. Overlaps row for row (the
same tensor twice, or under K and V) stay accepted.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import InconsistentLayersError, adapt
from flexkv_adapter.flexkv import plan

from ..helpers import distinct

ROWS, HEADS, DIM, PAGE = 32, 2, 4, 16


def _layers(shift_rows: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Two [ROWS, HEADS, DIM] layers in one buffer, the second starting ``shift_rows`` rows into the first."""
    base = distinct((4 * ROWS * HEADS * DIM,))
    row = HEADS * DIM
    return base, [base[i * shift_rows * row :][: ROWS * row].view(ROWS, HEADS, DIM) for i in range(2)]


@pytest.mark.parametrize("shift_rows", [PAGE, 1, ROWS - 1])
@pytest.mark.parametrize("form", ["k-list", "k-dict", "k-v"])
def test_views_sharing_bytes_with_shifted_rows_are_refused(shift_rows, form):
    _, (a, b) = _layers(shift_rows)
    other = [distinct((ROWS, HEADS, DIM), start=10_000 + 1000 * i) for i in range(2)]
    pool = {
        "k-list": SimpleNamespace(k_buffer=[a, b], v_buffer=other, page_size=PAGE),
        "k-dict": SimpleNamespace(
            k_buffer={"layers.0": a, "layers.1": b},
            v_buffer={"layers.0": other[0], "layers.1": other[1]},
            page_size=PAGE,
        ),
        "k-v": SimpleNamespace(k_buffer=[a], v_buffer=[b], page_size=PAGE),
    }[form]
    with pytest.raises(InconsistentLayersError, match="rows shifted"):
        adapt(pool)
    with pytest.raises(InconsistentLayersError, match="rows shifted"):
        plan(pool)


def test_row_for_row_sharing_is_still_accepted():
    _, (a, b) = _layers(ROWS)  # the control: adjacent, not overlapping
    v = [distinct((ROWS, HEADS, DIM), start=10_000 + 1000 * i) for i in range(2)]
    assert adapt(SimpleNamespace(k_buffer=[a, b], v_buffer=v, page_size=PAGE)).layer_ids == [0, 1]
    shared = adapt(SimpleNamespace(k_buffer=[a, a], v_buffer=v, page_size=PAGE))  # one tensor for two layers
    assert shared.k_buffer[0].data_ptr() == shared.k_buffer[1].data_ptr() == a.data_ptr()
    same = adapt(SimpleNamespace(k_buffer=[a], v_buffer=[a], page_size=PAGE))  # K and V one tensor
    same.v_buffer[0][3, 0, 0] = -5.0
    assert a[3, 0, 0].item() == -5.0 and plan(SimpleNamespace(k_buffer=[a], v_buffer=[a], page_size=PAGE))
