#!/usr/bin/env python3
"""vLLM part of bench_serving.py: vLLM's real Scheduler step with FlexKV's real connector (run in .venv-vllm).

Three engines are stepped in turn, with the same workload: ``none`` (no connector), ``baseline`` (the
plugin with only what construction needs: the lifecycle and stats wrappers are unwrapped on the
connector instances) and ``plugin`` (everything the plugin installs). Only ``schedule`` +
``update_from_output`` are timed. The worker side (FlexKV's real worker connector through vLLM's V2
driver) runs between them, untimed, as it does in another process in vLLM.

FlexKV's KVManager is the tier's stand-in (tests/vllm/fake_flexkv), with its transfers kept in flight
for ``POLLS`` polls, and its byte copies left out (:func:`_bookkeeping_only`): FlexKV copies in its
own transfer processes, never inside the scheduler's step.

A step is timed in this process's CPU time (nothing in it waits), and the plugin's ratio is the median of
paired steps: the three engines step in turn with the same requests, so a pair shares the machine's state
(on a shared 2-core machine a round's medians moved by up to 15 %, the modes within a step by a few %).

``--control``: the ``plugin`` engine is built as a second baseline (A/A), so its ratio shows what the method
reads when nothing differs but the engine instance (each mode has an engine of its own, with its own memory).
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "baseline", "plugin")
BLOCK, PROMPT, POLLS = 16, 40, 3
HOT = 64  # prompts that recur (FlexKV hits once stored)
# output lengths: vLLM 0.33 sums every in-flight prefill for each request it admits (scheduler.py:3434), so
# short requests at 4096 make its own step quadratic (seconds); decodes of 4-24 tokens keep it in bounds
MIN_OUT, MAX_OUT = 4, 24
# CPU time, not wall time: on a shared machine wall time takes in every preemption by another job
clock = time.process_time


def setup() -> Any:
    """FlexKV's real vllm_v1_adapter.py over the stand-in, and the plugin installed on vLLM's connector class."""
    import importlib.util
    import logging

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "vllm" / "fake_flexkv")]
    from tests.flexkv_source import find

    found = find()
    if not found.root:
        sys.exit(f"bench_serving: no FlexKV source tree: {found.skip_reason}")
    import flexkv.integration.vllm  # noqa: F401  (the stand-in's package)

    path = found.root / "flexkv" / "integration" / "vllm" / "vllm_v1_adapter.py"
    spec = importlib.util.spec_from_file_location("flexkv.integration.vllm.vllm_v1_adapter", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector import FlexKVConnectorV1

    from flexkv_adapter.integrations.vllm import plugin as plugin

    plugin.install()
    assert FlexKVConnectorV1.__dict__.get("_flexkv_adapter_installed"), "the plugin did not install"
    logging.getLogger("vllm").setLevel(logging.ERROR)
    logging.getLogger("flexkv_adapter").setLevel(logging.ERROR)  # failed loads warn, on purpose
    logging.getLogger("flexkv").setLevel(logging.CRITICAL)  # and FlexKV logs each at ERROR
    _bookkeeping_only()
    return FlexKVConnectorV1


def _bookkeeping_only() -> None:
    """The stand-in's transfers without their byte copies: outcomes and FlexKV's cache keys as before."""
    from flexkv.common.request import KVResponseStatus
    from flexkv.kvmanager import CONTROL, KVManager

    def run(self: Any, task: Any) -> Any:
        if task.kind == "batch":
            ok = all(run(self, t) == KVResponseStatus.SUCCESS for t in task.keys)
            return KVResponseStatus.SUCCESS if ok else KVResponseStatus.FAILED
        knob = "fail_gets" if task.kind == "get" else "fail_puts"
        if CONTROL[knob] > 0:
            CONTROL[knob] -= 1
            return KVResponseStatus.FAILED
        if task.kind == "get" and any(k not in self.cache for k in task.keys):
            return KVResponseStatus.FAILED
        if task.kind == "put":
            self.cache.update(dict.fromkeys(task.keys, ()))
        return KVResponseStatus.SUCCESS

    KVManager._run = run
    CONTROL["polls"] = POLLS


def lifecycle_off(conn: Any) -> None:
    """Baseline: vLLM's/FlexKV's own methods on this instance, as if the lifecycle wrappers were not installed."""
    from flexkv_adapter.integrations.vllm.lifecycle import applicable

    cls = type(conn)
    for name in (*applicable(cls), "get_kv_connector_stats"):
        setattr(conn, name, types.MethodType(getattr(cls, name).__wrapped__, conn))


class Engine:
    """vLLM's Scheduler (and for a connector mode, FlexKV's worker side) for ``n`` requests in flight."""

    def __init__(self, cls: Any, mode: str, n: int, tmp: Path, seed: int = 0, control: bool = False) -> None:
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: F401
        from vllm.v1.structured_output import StructuredOutputManager

        from tests.vllm.build import allocate, connector_config

        self.mode, self.n, self.rng = mode, n, random.Random(seed)
        kv_caches, kv_cache_config, _ = allocate("LBNHC", "mha3", blocks=(PROMPT + MAX_OUT) // BLOCK * n + 64)
        model_dir = tmp / f"{mode}-{n}-{seed}"
        model_dir.mkdir()
        config = connector_config(model_dir, "mha3")
        config.kv_transfer_config.kv_load_failure_policy = "recompute"
        if mode == "none":
            config.kv_transfer_config = None
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        config.cache_config.enable_prefix_caching = False  # every hit is FlexKV's
        config.scheduler_config.max_num_seqs = n
        config.scheduler_config.max_num_batched_tokens = max(2048, (PROMPT + 8) * n)
        self.config = config
        self.scheduler = Scheduler(
            vllm_config=config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=BLOCK,
        )
        self.driver, self.worker = None, None
        if mode != "none":
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
            from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

            self.worker = cls(config, KVConnectorRole.WORKER, kv_cache_config)
            kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
            self.driver = ActiveKVConnector(config, kv_caches)
            if mode == "baseline" or control:
                lifecycle_off(self.scheduler.connector)
                lifecycle_off(self.worker)
        self.kv_caches, self.added, self.finished, self.times = kv_caches, 0, 0, []

    def _new(self) -> None:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        init_none_hash(sha256)
        i, rng = self.added, self.rng
        if i % 2 == 0:  # a recurring prompt (a FlexKV hit once a request stored it) with its own last tokens
            hot = rng.randrange(HOT)
            tokens = [1000 + hot] * (2 * BLOCK) + [rng.randrange(50, 900) for _ in range(PROMPT - 2 * BLOCK)]
        else:  # a miss
            tokens = [rng.randrange(50, 30000) for _ in range(PROMPT)]
        params = SamplingParams(max_tokens=rng.randrange(MIN_OUT, MAX_OUT), ignore_eos=True)
        request = Request(f"r{i}", tokens, params, None, block_hasher=get_request_block_hasher(BLOCK, sha256))
        self.scheduler.add_request(request)
        self.added += 1

    def top_up(self) -> None:
        while len(self.scheduler.requests) < self.n:
            self._new()

    def _worker_output(self, so: Any) -> Any:
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.v1.outputs import ModelRunnerOutput

        kv_output = None
        if self.driver is not None:
            kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
            self.driver.pre_forward(so)
            self.driver.finish_forward()
            kv_output = self.driver.post_forward(so.finished_req_ids)
        requests = self.scheduler.requests
        ids = list(so.num_scheduled_tokens)
        sampled = [[7] if requests[r].num_computed_tokens >= requests[r].num_tokens else [] for r in ids]
        return ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=kv_output,
        )

    def step(self, fail_load: bool = False) -> float:
        """One engine step; returns the seconds spent in schedule + update_from_output."""
        from flexkv.kvmanager import CONTROL

        self.top_up()
        CONTROL["fail_gets"] = int(fail_load)
        t0 = clock()
        so = self.scheduler.schedule()
        t1 = clock()
        out = self._worker_output(so)
        t2 = clock()
        results = self.scheduler.update_from_output(so, out)
        t3 = clock()
        CONTROL["fail_gets"] = 0
        self.finished += sum(o.finish_reason is not None for e in results.values() for o in e.outputs)
        return (t1 - t0) + (t3 - t2)


def sizes_run(
    cls: Any, sizes: list[int], repeats: int, steps: int, tmp: Path, warm: int = 12, control: bool = False
) -> list[dict[str, Any]]:
    """Per size: the three engines stepped in turn (order rotating), ``warm`` steps then ``repeats`` rounds of
    ``steps`` steps. A mode's step time is the median over rounds of its rounds' medians; the plugin's ratio
    is the median of every paired step (plugin / baseline, same step). At 4096 requests a pair's ratio spreads
    by +-15 % (a step's CPU time moves with the memory of three large engines); the median of round medians of
    three pairs each read 0.93-1.01 in the A/A control, the median of all pairs 0.955-1.024 (30 pairs; the
    row resolves about +-4 %, the smaller sizes about +-1 %).

    No load fails here: the plugin has vLLM recompute a failed load where the baseline serves it as a hit,
    which is more work for vLLM, not the plugin's cost. Failed loads are in :func:`growth_run`.
    """
    rows = []
    for n in sizes:
        engines = {m: Engine(cls, m, n, tmp, control=control) for m in MODES}
        times: dict[str, list[float]] = {m: [] for m in MODES}
        rounds: dict[str, list[float]] = {m: [] for m in MODES}
        paired: list[float] = []  # plugin / baseline, step by step
        gc.collect()
        gc.freeze()  # as vLLM's engine core does after start-up: later collections skip these
        turn = 0
        for r in range(repeats + 1):
            gc.collect()  # between rounds, untimed: a collection inside a step lands on whichever mode ran then
            gc.disable()
            for _ in range(warm if r == 0 else steps):
                order, turn = MODES[turn % 3 :] + MODES[: turn % 3], turn + 1
                for m in order:
                    dt = engines[m].step()
                    if r > 0:
                        times[m].append(dt)
            gc.enable()
            if r > 0:
                for m in MODES:
                    rounds[m].append(statistics.median(times[m][-steps:]))
                pairs = zip(times["plugin"][-steps:], times["baseline"][-steps:], strict=True)
                paired += [p / b for p, b in pairs]
        med = {m: statistics.median(rounds[m]) * 1e6 for m in MODES}
        ratio = statistics.median(paired)
        plugin_us = med["baseline"] * ratio
        rows.append(
            {
                "requests": n,
                "baseline_us": round(med["baseline"], 2),
                "plugin_us": round(plugin_us, 2),
                "ratio": round(ratio, 3),
                "added_us": round(plugin_us - med["baseline"], 2),
                "no_connector_us": round(med["none"], 2),
                "repeats": repeats,
                "steps_per_repeat": steps,
                "finished": {m: e.finished for m, e in engines.items()},
            }
        )
        print(f"vllm n={n}: {rows[-1]}", file=sys.stderr, flush=True)
        gc.unfreeze()
        del engines
    return rows


def _paired(engine: Engine, reference: Engine, steps: int, fail_every: int = 5) -> list[float]:
    """``steps`` steps of ``engine`` and of ``reference`` in turn (a failed load every ``fail_every``-th):
    engine / reference, step by step. The machine's drift over the run is in both of a pair."""
    ratios = []
    for step in range(steps):
        fail = step % fail_every == 2
        ratios.append(engine.step(fail_load=fail) / reference.step(fail_load=fail))
    return ratios


def growth_run(cls: Any, finished: int, window: int, n: int, tmp: Path) -> dict[str, Any]:
    """The plugin's step through ``finished`` finished requests (a failed load every 5th step).

    The first and the last ``window`` steps are each stepped in turn with a fresh engine of the same kind (the
    same seed, so the same workload: its own steps 10 to 10 + ``window``): on a shared machine a step's speed
    drifts by 20 % over the run, which a plain last/first ratio would report as growth. The growth ratio is
    the median of engine/reference over the last window over that of the first window. It reads the growth of a
    step's own work (a scan of a table that only grows); what slows the whole process (a heap that collections
    walk) slows the reference too and cancels: ``sizes_at_end`` shows the plugin's and FlexKV's tables for that.
    """
    fresh = iter(range(2))

    def reference() -> Engine:
        folder = tmp / f"growth-reference-{next(fresh)}"
        folder.mkdir()
        made = Engine(cls, "plugin", n, folder, seed=1)
        for step in range(10):  # its admissions, as the engine's first 10 steps below
            made.step(fail_load=step % 5 == 2)
        return made

    engine = Engine(cls, "plugin", n, tmp, seed=1)
    for step in range(10):  # the first admissions
        engine.step(fail_load=step % 5 == 2)
    first = _paired(engine, reference(), window)
    steps = 10 + window
    while engine.finished < finished:
        engine.step(fail_load=steps % 5 == 2)
        steps += 1
    last = _paired(engine, reference(), window)
    first_ratio, last_ratio = statistics.median(first), statistics.median(last)
    ledger = engine.scheduler.connector._flexkv_adapter_ledger
    side = engine.scheduler.connector._flexkv_connector.connector
    sizes = {k: len(getattr(ledger, k)) for k in ("sending", "recving", "failed", "with_workers", "no_refetch")}
    sizes |= {k: len(getattr(side, k)) for k in ("req_id_to_task_dict", "get_tasks", "put_tasks", "tasks_to_launch")}
    return {
        "growth_ratio": round(last_ratio / first_ratio, 3),
        "growth": {
            "finished": engine.finished,
            "steps": steps + window,
            "in_flight": n,
            "first_vs_reference": round(first_ratio, 4),
            "last_vs_reference": round(last_ratio, 4),
            "window": window,
            "sizes_at_end": sizes,
        },
    }


def main(argv: list[str]) -> dict[str, Any]:
    quick, control = "--quick" in argv, "--control" in argv
    cls = setup()
    with tempfile.TemporaryDirectory() as tmp:
        if quick:
            out: dict[str, Any] = {"vllm": sizes_run(cls, [1, 8], repeats=2, steps=5, tmp=Path(tmp))}
            out |= growth_run(cls, finished=60, window=10, n=4, tmp=Path(tmp))
        else:
            plan = ((1, 7, 100, 12), (64, 7, 40, 12), (512, 7, 18, 10), (4096, 10, 3, 6))
            out = {"vllm": [row for n, r, s, w in plan for row in sizes_run(cls, [n], r, s, Path(tmp), w, control)]}
            if control:
                return out
            out |= growth_run(cls, finished=10_000, window=1000, n=12, tmp=Path(tmp))
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(main(sys.argv[1:])))
