"""The benchmark's measurement is honest: adapt and the floor copy nothing, the copy baseline does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_adapt.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_adapt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("method", "copies"), [("floor", False), ("adapt", False), ("copy", True)])
def test_run_point_reports_time_and_copied_bytes(bench, method, copies):
    r = bench.run_point(method, layers=4, rows=40, repeats=2)
    assert r["median_s"] > 0 and r["pool_bytes"] == 4 * 2 * 40 * bench.ROW_BYTES
    assert (r["bytes_copied"] > 0) is copies


def test_timing_repeats_in_rounds_until_the_minimum_settles(bench):
    calls = []
    times = bench._time_until_stable(lambda: calls.append(1), repeats=4)
    assert len(times) == len(calls) and len(times) % 4 == 0
    assert 8 <= len(times) <= 48  # at least two rounds to see it settle, at most twelve
    assert all(t >= 0 for t in times)
