"""16-byte alignment: what FlexKV's default copy kernel needs from every registered chunk (consumers §2)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import NotAddressableError, adapt


def flexkv_kernel_faults(chunk_bytes: int, addresses: list[int]) -> bool:
    """FlexKV's transfer.cu: 16-byte loads when the chunk is a multiple of 16 (base never checked)."""
    if chunk_bytes % 8:
        return True  # the remainder is dropped: not a fault, but lost bytes
    word = 16 if chunk_bytes % 16 == 0 else 8
    return any(a % word for a in addresses)


@settings(max_examples=60, deadline=None)
@given(
    offset=st.integers(0, 24).map(lambda k: 2 * k),
    page_size=st.sampled_from([1, 2, 3, 4, 16]),
    dim=st.sampled_from([2, 4, 6, 8]),
)
def test_adapt_accepts_exactly_the_bases_the_kernel_can_load(offset, page_size, dim):
    layers, rows = 2, 4 * page_size
    buf = torch.zeros(64 + layers * 2 * rows * dim * 2, dtype=torch.uint8)
    options = dict(shape=(layers, 2, rows, 1, dim), dtype=torch.bfloat16, axes="L KV N H D", offset=offset)
    chunk = page_size * dim * 2
    plane_bytes = rows * dim * 2
    planes = [buf.data_ptr() + offset + (2 * lay + kv) * plane_bytes for kv in (0, 1) for lay in range(layers)]
    addresses = [p + b * chunk for p in planes for b in range(rows // page_size)]
    if flexkv_kernel_faults(chunk, addresses):
        with pytest.raises(NotAddressableError):
            adapt(buf, page_size=page_size, **options)
    else:
        view = adapt(buf, page_size=page_size, **options)
        assert [t.data_ptr() for t in view.tensors()] == planes


def test_an_eight_but_not_sixteen_aligned_base_is_refused_with_the_reason():
    buf = torch.zeros(64 + 2 * 2 * 32 * 8 * 2, dtype=torch.uint8)
    assert buf.data_ptr() % 16 == 0
    with pytest.raises(NotAddressableError, match="16-byte loads.*misaligned-address"):
        adapt(buf, page_size=16, shape=(2, 2, 32, 1, 8), dtype=torch.bfloat16, axes="L KV N H D", offset=8)
    # an 8-byte chunk is copied in 8-byte words: the same offset is fine
    view = adapt(buf, page_size=1, shape=(2, 2, 32, 1, 4), dtype=torch.bfloat16, axes="L KV N H D", offset=8)
    assert view.tensors()[0].data_ptr() % 16 == 8
