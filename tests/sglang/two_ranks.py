"""Run one worker function on TP ranks 0 and 1 (forked processes, a real gloo group) and collect results."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .conftest import LLAMA

RESULT_S = 120  # each rank answers within this, or the test fails (never a stuck run)


def run_two_ranks(
    tmp_path: Path, target: Callable[..., None], make_args: Callable[..., tuple[Any, ...]]
) -> dict[int, tuple[str, Any]]:
    """``target(rank, *make_args(rendezvous, llama_dir, results_queue, spare_queue))`` on ranks 0 and 1."""
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(LLAMA))
    ctx = mp.get_context("fork")  # SGLang is imported already: spawning would import it twice more
    queue = ctx.Queue()
    common = make_args(str(tmp_path / "rdv"), str(tmp_path / "llama"), queue, ctx.Queue())
    procs = [ctx.Process(target=target, args=(rank, *common)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        results = {rank: (status, value) for rank, status, value in (queue.get(timeout=RESULT_S) for _ in procs)}
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results
