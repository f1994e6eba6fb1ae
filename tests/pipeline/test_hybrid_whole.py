"""Pools offloaded whole, without SGLang: pools shaped like SGLang's (attributes only) round-trip exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import adapt
from flexkv_adapter.flexkv import plan
from flexkv_adapter.model.hybrid import HybridPoolError

from ..sglang.whole_pools import roundtrip


def _fp4_like(interleaved: bool = False) -> SimpleNamespace:
    """MHA K/V plus K/V scales, per token ([rows, bytes]) or one row per page (MXFP8 at page 128)."""
    rows, page, layers = 64, 16, 2
    scale = (rows // page, page * 2) if interleaved else (rows, 2)
    return SimpleNamespace(
        k_buffer=[torch.zeros(rows, 2, 8, dtype=torch.uint8) for _ in range(layers)],
        v_buffer=[torch.zeros(rows, 2, 8, dtype=torch.uint8) for _ in range(layers)],
        k_scale_buffer=[torch.zeros(scale, dtype=torch.uint8) for _ in range(layers)],
        v_scale_buffer=[torch.zeros(scale, dtype=torch.uint8) for _ in range(layers)],
        page_size=page,
    )


def _dsa_like(skip: bool = False) -> SimpleNamespace:
    """MLA KV plus one index row per page, the second layer's empty when it reuses the previous top-k."""
    rows, page = 192, 64
    return SimpleNamespace(
        kv_buffer=[torch.zeros(rows, 1, 32, dtype=torch.bfloat16) for _ in range(2)],
        index_k_with_scale_buffer=[torch.zeros(0 if skip and i else 3, 64 * 132, dtype=torch.uint8) for i in range(2)],
        index_kpool=1,
        page_size=page,
    )


CASES = {
    "scales-per-token": (_fp4_like, "k_scale_buffer/v_scale_buffer"),
    "scales-per-page": (lambda: _fp4_like(True), "k_scale_buffer/v_scale_buffer"),
    "indexer": (_dsa_like, "index_k_with_scale_buffer"),
    "indexer-skip-layer": (lambda: _dsa_like(True), "index_k_with_scale_buffer"),
}


@pytest.mark.parametrize("case", CASES)
def test_round_trip_is_exact_and_dropping_the_plane_is_caught(case, fake_flexkv):
    factory, plane = CASES[case]
    assert roundtrip(factory(), reader=lambda pool: []) == []
    wrong = roundtrip(factory(), drop=plane, reader=lambda pool: [])
    assert wrong and all(w.startswith(plane) for w in wrong)


def test_planes_are_zero_copy_and_grouped_in_flexkv_terms():
    pool = _dsa_like(skip=True)
    p = plan(adapt(pool))
    kv, index = p.groups
    assert (kv.layer_indices, kv.num_head, kv.head_size, kv.dtype) == ((0, 1), 1, 32, torch.bfloat16)
    assert (index.layer_indices, index.head_size, index.tokens_per_block, index.chunk_bytes) == ((0,), 132, 64, 8448)
    assert index.tensors[0].data_ptr() == pool.index_k_with_scale_buffer[0].data_ptr()


def test_a_plane_whose_rows_match_neither_tokens_nor_pages_is_refused():
    pool = _fp4_like()
    pool.k_scale_buffer = [torch.zeros(48, 2, dtype=torch.uint8) for _ in range(2)]
    pool.v_scale_buffer = [torch.zeros(48, 2, dtype=torch.uint8) for _ in range(2)]
    with pytest.raises(HybridPoolError, match="neither one row per token nor one per page"):
        adapt(pool)


def test_an_unknown_tensor_beside_the_planes_is_refused_by_name():
    pool = _fp4_like()
    pool.extra_state = [torch.ones(64, 4) for _ in range(2)]
    with pytest.raises(HybridPoolError, match="extra_state"):
        adapt(pool)
