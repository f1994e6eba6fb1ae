"""Block-count alignment: rows trimmed to a page multiple, zero-copy, reported and logged."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import torch

from flexkv_adapter import adapt

from ..helpers import SGLangLikeMHAPool


def test_rows_are_trimmed_to_a_page_multiple_and_reported(caplog):
    pool = SGLangLikeMHAPool(size=54, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)
    with caplog.at_level(logging.INFO, logger="flexkv_adapter"):
        view = adapt(pool)
    r = view.report
    assert (r.rows, r.aligned_rows, r.dropped_rows, r.num_blocks) == (70, 64, 6, 4)
    assert all(t.shape[0] == 64 and t.is_contiguous() for t in view.tensors())
    assert any("trimmed rows 70 -> 64 (dropped 6)" in m for m in caplog.messages)
    assert view.k_buffer[0].data_ptr() == pool.k_buffer[0].data_ptr()


def test_aligned_pools_are_not_trimmed_and_log_nothing(caplog):
    pool = SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)
    with caplog.at_level(logging.INFO, logger="flexkv_adapter"):
        view = adapt(pool)
    assert view.report.dropped_rows == 0 and view.num_blocks == 4
    assert view.k_buffer[0].shape == pool.k_buffer[0].shape
    assert not [m for m in caplog.messages if "trimmed" in m]


def test_page_size_argument_is_used_when_the_pool_has_none():
    pool = SimpleNamespace(kv_cache=[torch.zeros(100, 1, 8) for _ in range(2)])
    view = adapt(pool, page_size=32)
    assert (view.report.aligned_rows, view.num_blocks, view.page_size) == (96, 3, 32)


def test_report_is_frozen_json_ready_and_readable():
    pool = SGLangLikeMHAPool(
        size=54, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2, start_layer=3
    )
    r = adapt(pool).report
    data = json.loads(json.dumps(r.to_dict()))
    assert data["layer_ids"] == [3, 4] and data["dropped_rows"] == 6 and data["bytes_copied"] == 0
    assert data["bytes_aliased"] == 4 * 64 * 2 * 4 * 4
    text = str(r)
    assert "MHA view via sglang-mha" in text and "rows: 70 -> 64 (dropped 6" in text and "ids 3..4" in text
    try:
        r.kind = "mla"  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("report must be frozen")


def test_overlapping_exposed_tensors_are_warned_about(caplog):
    shared = torch.zeros(32, 1, 8)
    pool = {"layers.0.attn": shared, "layers.1.attn": shared}
    with caplog.at_level(logging.WARNING, logger="flexkv_adapter"):
        view = adapt(pool, page_size=16)
    assert view.report.warnings == ("kv[0] overlaps kv[1]",)
    assert any("overlaps" in m for m in caplog.messages)
