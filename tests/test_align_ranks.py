"""Cross-rank alignment over real multi-process gloo groups (spawned processes, file rendezvous)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.align import align_across_ranks

from . import dist_worker
from .helpers import SGLangLikeMHAPool


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
