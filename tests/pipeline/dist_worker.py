"""Rank bodies for the multi-process alignment tests (run in spawned processes, real gloo groups)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from flexkv_adapter import adapt
from flexkv_adapter.pipeline.align import align_across_ranks, align_block_counts

from ..helpers import SGLangLikeMHAPool

TIMEOUT = 2.0


def _pool(rank: int, heads: int = 2) -> SGLangLikeMHAPool:
    # rank r holds 5 + r blocks (SGLang keeps size + page_size rows)
    return SGLangLikeMHAPool(
        size=64 + 16 * rank, page_size=16, dtype=torch.float32, head_num=heads, head_dim=4, layer_num=2
    )


def sizes(rank: int, world: int) -> Any:
    pool = _pool(rank)
    view = align_across_ranks(adapt(pool), timeout=TIMEOUT)
    view.k_buffer[1].fill_(-1.0)  # still aliases the pool
    aliased = bool((pool.k_buffer[1][: view.num_blocks * 16] == -1.0).all())
    untouched = bool((pool.k_buffer[1][view.num_blocks * 16 :] != -1.0).all())
    return {
        "num_blocks": view.num_blocks,
        "rows": [t.shape[0] for t in view.tensors()],
        "aliased": aliased and untouched,
        "notes": list(view.report.notes),
    }


def block_counts(rank: int, world: int) -> Any:
    config = {"num_cpu_blocks": 1000 - rank, "num_ssd_blocks": 5000 + rank, "num_remote_blocks": None}
    changes = align_block_counts(config, timeout=TIMEOUT)

    class CacheConfig:
        num_cpu_blocks, num_ssd_blocks, num_remote_blocks = 10 + rank, 7, 3 * (rank + 1)

    obj = CacheConfig()
    align_block_counts(obj, timeout=TIMEOUT)
    return {
        "config": config,
        "changes": {k: list(v) for k, v in changes.items()},
        "object": [obj.num_cpu_blocks, obj.num_ssd_blocks, obj.num_remote_blocks],
    }


def mismatch(rank: int, world: int) -> Any:
    return align_across_ranks(adapt(_pool(rank, heads=4 if rank == 2 else 2)), timeout=TIMEOUT).num_blocks


def missing(rank: int, world: int) -> Any:
    if rank == world - 1:
        time.sleep(TIMEOUT * 2.5)  # never joins the collective
        return "stayed away"
    return align_across_ranks(adapt(_pool(rank)), timeout=TIMEOUT).num_blocks


def mixed_calls(rank: int, world: int) -> Any:
    """Rank 0 aligns views, the others block counts (rank 2 over other names): a programming error."""
    if rank == 0:
        return align_across_ranks(adapt(_pool(rank)), timeout=TIMEOUT).num_blocks
    names = ("num_cpu_blocks",) if rank == 2 else ("num_cpu_blocks", "num_ssd_blocks")
    return align_block_counts({"num_cpu_blocks": 8, "num_ssd_blocks": 9}, timeout=TIMEOUT, names=names)


BAD_COUNTS: dict[int, Any] = {1: -1, 2: 7.9}


def bad_counts(rank: int, world: int) -> Any:
    """Ranks 1 and 2 hold counts that are not block counts; every rank must refuse, none may hang."""
    config = {"num_cpu_blocks": BAD_COUNTS.get(rank, 100 + rank), "num_ssd_blocks": None}
    try:
        align_block_counts(config, timeout=TIMEOUT)
    finally:
        assert config["num_cpu_blocks"] == BAD_COUNTS.get(rank, 100 + rank)  # nothing agreed, nothing written


def bad_timeout(rank: int, world: int) -> Any:
    """Rank 1 passes timeout=nan: refused on rank 1 at once; rank 0 waits its own timeout, then fails."""
    return align_block_counts({"num_cpu_blocks": 4}, timeout=float("nan") if rank == 1 else TIMEOUT)


SCENARIOS = {
    "sizes": sizes,
    "block_counts": block_counts,
    "mismatch": mismatch,
    "missing": missing,
    "mixed_calls": mixed_calls,
    "bad_counts": bad_counts,
    "bad_timeout": bad_timeout,
}


def run(rank: int, world: int, rendezvous: str, scenario: str, queue: Any) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    started = time.monotonic()
    try:
        queue.put((rank, "ok", SCENARIOS[scenario](rank, world), time.monotonic() - started))
    except Exception as exc:  # reported to the parent, which asserts on it
        queue.put((rank, type(exc).__name__, str(exc), time.monotonic() - started))
    queue.close()
    queue.join_thread()
    # Skip interpreter teardown: gloo's destructors abort when peers have already gone.
    os._exit(0)
