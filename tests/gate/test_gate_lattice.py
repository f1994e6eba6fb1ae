"""The gate's arithmetic disjointness proof (K and V interleaved block by block) never calls sharing bytes apart.

It must hold at any size (large pools have more runs than the exact enumeration takes), so it is checked
here against the bytes themselves on small tensors, and on a large pool for what it is for.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import gate


def _bytes(t: torch.Tensor) -> set[int]:
    item, out = t.element_size(), set()
    for index in torch.cartesian_prod(*[torch.arange(n) for n in t.shape]).reshape(-1, t.dim()).tolist():
        start = t.data_ptr() + sum(i * s for i, s in zip(index, t.stride())) * item
        out.update(range(start, start + item))
    return out


@st.composite
def two_views(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    blocks, planes, row = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([torch.uint8, torch.bfloat16, torch.float32]))
    storage = torch.zeros(blocks * planes * row * 2 + 8, dtype=dtype)
    stride = draw(st.sampled_from([(planes * row, 1), (planes * row * 2, 1), (row, 1)]))
    width = draw(st.integers(1, row))
    views = []
    for _ in range(2):
        offset = draw(st.integers(0, 8))
        views.append(torch.as_strided(storage, (blocks, width), stride, offset))
    return views[0], views[1]


@given(two_views())
def test_the_lattice_proof_only_calls_tensors_apart_that_share_no_byte(views):
    a, b = views
    if gate._lattice_apart(a, b):
        assert not _bytes(a) & _bytes(b)
    if _bytes(a) & _bytes(b):
        assert gate._bytes_meet(a, b)  # whatever proves what: sharing is never missed


def test_k_and_v_interleaved_per_block_are_apart_at_any_size():
    kv = torch.zeros(270_000, 2, 16, 8, dtype=torch.bfloat16)  # more runs than the exact check enumerates
    assert not gate._bytes_meet(kv[:, 0], kv[:, 1])
    shifted = torch.as_strided(kv, kv[:, 1].shape, kv[:, 1].stride(), kv[:, 1].storage_offset() - 8)
    assert gate._bytes_meet(kv[:, 0], shifted)  # V half a row into K: not proven apart, so refused
