"""5-D per-layer tensors (consumers §3): FlexKV's tp worker probes strides, its layerwise/NIXL workers do not.

A plan is accepted only when both readings land on the source's blocks; the probe takes the first
leading axis of size 2 as K/V, so 2-block caches and caches whose block count equals the page size
(or a view with its own strides) are refused.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, NotAddressableError
from flexkv_adapter.flexkv import plan

from ..helpers import distinct, flexkv_worker_read, region_bytes

L, H, D = 2, 2, 4


def _layers(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    return {f"model.layers.{i}.attn": distinct(shape, torch.int32, 10_000 * i) for i in range(L)}


@pytest.mark.parametrize("axes", ["KV P T H D", "P KV T H D"])
@pytest.mark.parametrize("page", [4, 16])
def test_two_block_caches_are_refused(axes, page):
    layers = _layers((2, 2, page, H, D))
    with pytest.raises(NotAddressableError, match="num_blocks == 2"):
        plan(layers, head_num=H, page_size=page, axes=axes)
    with pytest.raises(AdapterError):  # without axes, the two readings are ambiguous
        plan(layers, head_num=H, page_size=page)


def test_block_count_equal_to_the_page_size_fools_the_probe_and_is_refused():
    layers = _layers((2, 16, 16, H, D))  # [KV, NB, BS]: the probe takes NB (=16) for the tokens axis
    with pytest.raises(NotAddressableError, match="stride probe"):
        plan(layers, head_num=H, page_size=16)


def test_a_5d_view_with_its_own_strides_is_refused():
    blocks_first = [distinct((4, 2, 16, H, D), torch.int32, 10_000 * i) for i in range(L)]
    kv_first_view = {f"model.layers.{i}.attn": t.permute(1, 0, 2, 3, 4) for i, t in enumerate(blocks_first)}
    with pytest.raises(AdapterError):
        plan(kv_first_view, head_num=H, page_size=16, axes="KV P T H D")


@settings(max_examples=40, deadline=None)
@given(
    kv_first=st.booleans(),
    num_blocks=st.integers(1, 6),
    page=st.sampled_from([1, 2, 3, 4, 8]),
)
def test_accepted_5d_plans_read_the_same_bytes_in_every_worker(kv_first, num_blocks, page):
    shape = (2, num_blocks, page, H, D) if kv_first else (num_blocks, 2, page, H, D)
    layers = _layers(shape)
    layout = {"type": "LAYERFIRST" if kv_first else "LAYERBLOCK", "num_layer": L, "num_block": num_blocks}
    layout |= {"tokens_per_block": page, "num_head": H, "head_size": D, "kv_dim": 2, "num_kv_heads": H}
    blocks = [
        (lay, kv, b, t[kv, b] if kv_first else t[b, kv])
        for lay, t in enumerate(layers.values())
        for kv in range(2)
        for b in range(num_blocks)
    ]
    tp_misreads = any(
        flexkv_worker_read(layout, list(layers.values()), lay, kv, b) != region_bytes(region)
        for lay, kv, b, region in blocks
    )
    try:
        p = plan(layers, head_num=H, page_size=page, axes="KV P T H D" if kv_first else "P KV T H D")
    except NotAddressableError:
        assert num_blocks == 2 or tp_misreads
        return
    assert not tp_misreads
    fields, tensors = p.layout_fields(), list(p.tensors)
    for layer, t in enumerate(layers.values()):
        for kv in range(2):
            for block in range(num_blocks):
                expected = region_bytes(t[kv, block] if kv_first else t[block, kv])
                assert flexkv_worker_read(fields, tensors, layer, kv, block, worker="tp") == expected
                assert flexkv_worker_read(fields, tensors, layer, kv, block, worker="layerwise") == expected
