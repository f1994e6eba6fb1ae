"""Cross-rank alignment over real multi-process gloo groups (spawned processes, file rendezvous)."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.errors import AlignmentError
from flexkv_adapter.pipeline.align import align_across_ranks, align_block_counts

from ..helpers import SGLangLikeMHAPool
from . import dist_worker


@dataclass(frozen=True)
class FrozenConfig:
    num_cpu_blocks: int


class RaisingConfig:
    @property
    def num_cpu_blocks(self) -> int:
        raise RuntimeError("not configured yet")


def _run(world: int, scenario: str, tmp_path) -> dict[int, tuple]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=dist_worker.run, args=(r, world, str(tmp_path / "rdv"), scenario, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in range(world):
            rank, status, value, elapsed = queue.get(timeout=90)
            results[rank] = (status, value, elapsed)
        for p in procs:
            p.join(timeout=30)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_gets_the_minimum_block_count_still_zero_copy(world, tmp_path):
    results = _run(world, "sizes", tmp_path)
    for rank, (status, value, _) in results.items():
        assert status == "ok", value
        assert value["num_blocks"] == 5 and value["rows"] == [80] * 4 and value["aliased"]
        assert bool(value["notes"]) == (rank > 0)


def test_flexkv_block_counts_are_min_aligned_on_mappings_and_objects(tmp_path):
    results = _run(4, "block_counts", tmp_path)
    for rank, (status, value, _) in results.items():
        assert status == "ok", value
        assert value["config"] == {"num_cpu_blocks": 997, "num_ssd_blocks": 5000, "num_remote_blocks": None}
        assert value["changes"]["num_cpu_blocks"] == [1000 - rank, 997]
        assert value["object"] == [10, 7, 3]


def test_a_mismatched_rank_fails_every_rank_with_one_clear_error(tmp_path):
    results = _run(4, "mismatch", tmp_path)
    for status, message, _ in results.values():
        assert status == "AlignmentError"
        assert "ranks [2] disagree with rank 0" in message and "'heads': 4" in message


def test_a_rank_that_never_joins_produces_an_error_not_a_hang(tmp_path):
    results = _run(3, "missing", tmp_path)
    assert results[2][:2] == ("ok", "stayed away")
    for rank in (0, 1):
        status, message, elapsed = results[rank]
        assert status == "AlignmentError", message
        assert "not every rank reached align_across_ranks within 2s" in message
        assert elapsed < 20


def test_alignment_needs_a_process_group():
    view = adapt(SGLangLikeMHAPool(48, 16, __import__("torch").float32, head_num=2, head_dim=4, layer_num=2))
    with pytest.raises(AdapterError, match="initialised torch.distributed"):
        align_across_ranks(view)


def test_ranks_calling_different_collectives_all_fail_with_an_alignment_error(tmp_path):
    results = _run(3, "mixed_calls", tmp_path)
    for rank, (status, message, elapsed) in results.items():
        assert status == "AlignmentError", (rank, message)
        assert "rank 0: align_across_ranks" in message and "rank 2: align_block_counts(num_cpu_blocks)" in message
        assert elapsed < 20


def test_invalid_block_counts_are_refused_on_every_rank_before_agreeing(tmp_path):
    results = _run(3, "bad_counts", tmp_path)
    for rank, (status, message, elapsed) in results.items():
        assert status == "AlignmentError", (rank, message)
        assert "rank 1: num_cpu_blocks=-1" in message and "rank 2: num_cpu_blocks=7.9" in message, message
        assert elapsed < 20


def test_an_invalid_timeout_fails_at_once_and_the_other_ranks_do_not_hang(tmp_path):
    results = _run(2, "bad_timeout", tmp_path)
    status, message, elapsed = results[1]
    assert status == "AlignmentError" and "timeout=nan" in message and elapsed < 1
    status, message, elapsed = results[0]
    assert status == "AlignmentError" and "not every rank reached align_block_counts" in message and elapsed < 20


@pytest.mark.parametrize("timeout", [float("nan"), -1, 0, True, "5", float("inf"), 1e12])
def test_invalid_timeouts_are_refused_before_the_collective(timeout):
    with pytest.raises(AlignmentError, match="timeout="):
        align_block_counts({"num_cpu_blocks": 4}, timeout=timeout)
    view = adapt(SGLangLikeMHAPool(48, 16, __import__("torch").float32, head_num=2, head_dim=4, layer_num=2))
    with pytest.raises(AlignmentError, match="timeout="):
        align_across_ranks(view, timeout=timeout)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_cpu_blocks": -1}, "num_cpu_blocks=-1"),
        ({"num_cpu_blocks": 7.9}, "num_cpu_blocks=7.9"),
        ({"num_cpu_blocks": True}, "num_cpu_blocks=True"),
        ({"num_cpu_blocks": "8"}, "num_cpu_blocks='8'"),
        (MappingProxyType({"num_cpu_blocks": 8}), "cannot be updated"),
        (FrozenConfig(8), "cannot set num_cpu_blocks"),
        (RaisingConfig(), "reading num_cpu_blocks raised"),
    ],
)
def test_invalid_block_counts_are_refused_on_the_calling_rank(config, message):
    with pytest.raises(AlignmentError, match=message):
        align_block_counts(config)


def test_align_across_ranks_needs_a_view():
    with pytest.raises(AlignmentError, match="needs a view"):
        align_across_ranks(object())  # type: ignore[arg-type]
