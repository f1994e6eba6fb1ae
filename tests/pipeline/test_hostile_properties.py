"""Property: on hostile inputs adapt() returns exactly the right elements, or raises AdapterError.

Nothing else may escape (no TypeError, RuntimeError, RecursionError...). Example counts come from
the hypothesis profile loaded in conftest.py ("ci": 2,000 per strategy, derandomized).
"""

from __future__ import annotations

from hypothesis import event, given, note

from flexkv_adapter import AdapterError, adapt

from ..helpers import flexkv_block_bytes, region_bytes
from ..strategies.cases import Case, check_view
from ..strategies.hostile import (
    byte_buffers,
    check_split,
    raising_attributes,
    split_containers,
    storage_less,
    strided_tensors,
)
from ..strategies.pools import extent_mismatches, markers_next_to_attrs, pair_confusions, shuffled_dicts


def _holds(case: Case) -> None:
    note(f"options={case.options} notes={case.notes}")
    try:
        view = adapt(case.pool, **case.options)
    except AdapterError as exc:
        event(f"refused: {type(exc).__name__}")
        assert not case.must_succeed, f"refused a fully specified, addressable input: {exc}"
        return
    event("adapted")
    check_view(view, case)


@given(pair_confusions())
def test_pairs_lists_and_kv_tensors(case):
    _holds(case)


@given(extent_mismatches())
def test_a_layer_with_other_extents_is_refused(case):
    _holds(case)


@given(markers_next_to_attrs())
def test_explicit_attrs_beat_hybrid_markers(case):
    _holds(case)


@given(shuffled_dicts())
def test_dict_names_and_layer_ids(case):
    _holds(case)


@given(raising_attributes())
def test_raising_attributes(case):
    _holds(case)


@given(storage_less())
def test_tensors_without_storage(case):
    _holds(case)


@given(byte_buffers())
def test_byte_buffer_geometry(case):
    _holds(case)


@given(split_containers())
def test_separate_k_and_v_containers_pair_by_layer(case):
    note(f"options={case.options} notes={case.notes} k={case.pool.k_buffer!r:.300} v={case.pool.v_buffer!r:.300}")
    try:
        view = adapt(case.pool, **case.options)
    except AdapterError as exc:
        event(f"refused: {type(exc).__name__}")
        assert not case.must_succeed, f"refused two plain lists: {exc}"
        return
    event("adapted")
    check_split(view, case)


@given(strided_tensors())
def test_any_strides_read_right_where_flexkv_reads(case):
    note(f"shape={tuple(case.pool.shape)} notes={case.notes}")
    try:
        view = adapt(case.pool, **case.options)
    except AdapterError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("adapted")
    page = view.page_size
    for plane, regions in case.expected.items():
        for got, region in zip(getattr(view, f"{plane}_buffer"), regions):
            for block in range(view.num_blocks):
                rows = region[block * page : (block + 1) * page]
                assert flexkv_block_bytes(got, block, page) == region_bytes(rows), (plane, block)
