"""Pools offloaded whole through FlexKV's layer groups: exact round trips, and a negative control per case."""

from __future__ import annotations

import pytest

from .pools import dsa, fp4, minimax, mla_fp4, mxfp8
from .whole_pools import roundtrip

CASES = {
    "mha-fp4": (fp4, "k_scale_buffer/v_scale_buffer"),
    "mha-mxfp8-per-token": (mxfp8, "k_scale_buffer/v_scale_buffer"),
    "mha-mxfp8-interleaved-128": (lambda: mxfp8(128), "k_scale_buffer/v_scale_buffer"),
    "mla-fp4": (mla_fp4, "kv_scale_buffer"),
    "dsa": (dsa, "index_k_with_scale_buffer"),
    "dsa-skip-topk-layer": (lambda: dsa(skip=[False, True, False]), "index_k_with_scale_buffer"),
    "dsa-one-layer": (lambda: dsa(skip=[False]), "index_k_with_scale_buffer"),
    "dsa-kpool-2": (lambda: dsa(kpool=2), "index_k_with_scale_buffer"),
    "dsa-pp-stage-from-layer-4": (lambda: dsa(skip=[True, False], start_layer=4), "index_k_with_scale_buffer"),
    "minimax-index-kv": (minimax, "index_kv_pool.k_buffer/v_buffer"),
}


@pytest.mark.parametrize("case", CASES)
def test_every_plane_round_trips_into_other_pages_and_nothing_else_changes(case, fake_flexkv):
    factory, _ = CASES[case]
    assert roundtrip(factory()) == []


@pytest.mark.parametrize("case", CASES)
def test_dropping_a_plane_from_the_registration_is_caught(case, fake_flexkv):
    factory, plane = CASES[case]
    wrong = roundtrip(factory(), drop=plane)
    assert wrong and any(plane.split("/")[0].split(".")[0] in w or "index" in w or "scale" in w for w in wrong)
