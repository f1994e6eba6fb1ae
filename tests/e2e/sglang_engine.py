"""SGLang's CPU engine generating through the plugin and FlexKV's real Python (run in .venv-sglang).

``python -m tests.e2e.sglang_engine MODEL_DIR STATE_DIR`` starts ``sglang.Engine(device="cpu")`` with
``--enable-flexkv`` (the plugin comes in through SGLang's own loader: ``SGLANG_PLUGINS=flexkv_adapter``
and the installed entry point), runs the scenarios below greedily, and prints one ``RESULT {json}``
line (``tests/e2e/engine_process.emit``). FlexKV's connector, KVManager, task engine, cache engine and
transfer worker are FlexKV's own; only its compiled/CUDA parts are replaced, in every process, by
``tests/flexkv_cpu`` (``FLEXKV_CPU=1``, ``tests/flexkv_cpu/site`` on ``PYTHONPATH``; the driver sets
both). The data plane's counters (blocks copied each way) are FlexKV-side facts read from STATE_DIR.

Scenarios (each restore is preceded by memory pressure: SGLang's own radix cache holds
``MAX_TOTAL_TOKENS`` tokens, and three other prompts push A out of it):

* ``cold``: A, nothing cached anywhere;
* ``restored``: A again after the pressure: served by FlexKV (blocks copied host->device > 0);
* ``partial_reference``/``partial``: P shares A's first ``SHARED`` tokens only. The reference runs with a
  ``cache_salt`` (the plugin sends salted requests past FlexKV, SGLang's radix keys them apart);
* ``perturbed``: A again while FlexKV's CPU copy is zeroed before each restore (the negative control);
* ``flush``/``after_flush``: ``Engine.flush_cache()`` (what a weight update runs), then A again: nothing
  cached anywhere (FlexKV 34ab141's reset fails as shipped without the plugin's repair of its task table);
* ``p<n>_filler<i>``: the other prompts; from the second round on FlexKV restores them too.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.engine_process import emit
from tests.e2e.tiny_model import prompt_ids
from tests.flexkv_cpu.counters import read_counters

PAGE = 16
MAX_TOTAL_TOKENS = 640
PROMPT = 192  # 12 pages
CHUNK = 64  # SGLang prefills prompts in chunks of 4 pages (chunked prefill, its default, at a size the prompts exceed)
SHARED = 96  # the partial prompt's pages in common with A
NEW_TOKENS = 24
A = prompt_ids([(7 * i + 3) % 400 for i in range(PROMPT)])
P = A[:SHARED] + prompt_ids([(11 * i + 5) % 400 for i in range(PROMPT - SHARED)])
FILLERS = [prompt_ids([(13 * i + 17 * f + 1) % 400 for i in range(PROMPT)]) for f in range(3)]
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def _wait_stored(state: Path, at_least: int, timeout_s: float = 60.0) -> dict[str, int]:
    """FlexKV stores asynchronously: wait until the data plane has copied ``at_least`` blocks to the host."""
    deadline = time.monotonic() + timeout_s
    while True:
        counters = read_counters(state)
        if counters["d2h_blocks"] >= at_least or time.monotonic() > deadline:
            return counters
        time.sleep(0.2)


class Run:
    def __init__(self, engine: Any, state: Path) -> None:
        self.engine, self.state = engine, state
        self.steps: dict[str, Any] = {}

    def gen(self, name: str, ids: list[int], salt: str | None = None) -> list[int]:
        before = read_counters(self.state)
        out = self.engine.generate(input_ids=ids, sampling_params=GREEDY, cache_salt=salt)
        after = read_counters(self.state)
        meta = out.get("meta_info", {})
        self.steps[name] = {
            "tokens": list(out["output_ids"]),
            "cached_tokens": meta.get("cached_tokens"),
            "cached_tokens_details": meta.get("cached_tokens_details"),
            "restored_blocks": after["h2d_blocks"] - before["h2d_blocks"],
            "perturbed_blocks": after["perturbed_blocks"] - before["perturbed_blocks"],
        }
        return list(out["output_ids"])

    def pressure(self, tag: str) -> None:
        stored = read_counters(self.state)["d2h_blocks"]
        for i, ids in enumerate(FILLERS):
            self.gen(f"{tag}_filler{i}", ids)
        _wait_stored(self.state, stored + 1)


def main(model: str, state_dir: str) -> None:
    import sglang

    state = Path(state_dir)
    t0 = time.monotonic()
    engine = sglang.Engine(
        model_path=model, device="cpu", attention_backend="torch_native", sampling_backend="pytorch",
        enable_flexkv=True, page_size=PAGE, max_total_tokens=MAX_TOTAL_TOKENS, dtype="bfloat16",
        disable_cuda_graph=True, chunked_prefill_size=CHUNK, max_running_requests=4, log_level="warning",
        random_seed=0, skip_server_warmup=True, mem_fraction_static=0.8,
    )  # fmt: skip
    started = time.monotonic() - t0
    run = Run(engine, state)
    try:
        run.gen("cold", A)
        stored_a = _wait_stored(state, PROMPT // PAGE)["d2h_blocks"]
        run.pressure("p1")
        run.gen("restored", A)
        run.gen("partial_reference", P, salt="reference")
        run.pressure("p2")
        run.gen("partial", P)
        run.pressure("p3")
        (state / "perturb").touch()
        run.gen("perturbed", A)
        (state / "perturb").unlink()
        flushed = engine.flush_cache()  # what a weight update does: SGLang's flush, FlexKV emptied with it
        run.steps["flush"] = {"success": bool(flushed.success), "message": flushed.message}
        run.gen("after_flush", A)
    finally:
        engine.shutdown()
    emit({"started_s": round(started, 1), "total_s": round(time.monotonic() - t0, 1), "stored_after_cold": stored_a,
          "steps": run.steps, "counters": read_counters(state), "shared_pages": SHARED // PAGE,
          "chunked_prefill_size": engine.server_args.chunked_prefill_size, "prompt": PROMPT,
          "c_ext": importlib.import_module("flexkv.c_ext").__git_commit__,  # the same path and boot as its children
          "index_accel": os.environ.get("FLEXKV_INDEX_ACCEL", "FlexKV's default")})  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
