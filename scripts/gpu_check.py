#!/usr/bin/env python3
"""Check on a GPU what FlexKV's workers will do with adapted views; without one, run the CPU parts.

1. Builds a pool of every supported kind (``flexkv_adapter.cli.samples``) on the device, fills it with
   random bytes, adapts it, and proves zero-copy by writing through the view and reading the
   pool's own tensors.
2. Shares every view tensor with a second process through ``torch.multiprocessing`` reductions
   (``reduce_tensor``, what FlexKV's ``TensorSharedHandle`` uses; CUDA handles travel pickled, as
   over FlexKV's ZMQ socket) and compares bytes and offsets inside the allocation.
3. Emulates FlexKV's stride-blind block copy: for every registered tensor and block it gathers
   ``data_ptr + b * block_bytes`` in 8- and 16-byte words straight from the pool's allocation
   (a Triton kernel when Triton and CUDA are present, else one torch gather on the raw words) and
   compares with the view's block; a base the word size does not divide counts as a fault.
4. Times ``adapt()`` on a pool of ``--big-gib`` GiB and reports device memory before and after.
5. vLLM sleep mode: the plugin's re-registration on wake addresses the woken KV memory (gpu_check_sleep.py).

Parts 1 and 3 live in gpu_check_copy.py, part 2 in gpu_check_share.py; this file runs them all.

    python scripts/gpu_check.py [--device auto|cuda|cpu] [--big-gib 100] [--out result.json]

Prints one JSON object, then a verdict as the last line on stderr (``gpu_check: ok`` or
``gpu_check: N failures``, N the length of the JSON's ``failures``); exits 0 when no check failed
(skipped checks say why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

try:  # the wrong interpreter (system python): say which one to use instead of a traceback
    import pydantic_settings  # noqa: F401  (flexkv_adapter's own dependency)
    import torch
except ModuleNotFoundError as _missing:
    _fix = "Run `bash scripts/setup.sh`, then .venv/bin/python scripts/gpu_check.py (or activate .venv)"
    sys.exit(f"gpu_check.py: {_missing} in {sys.executable}. {_fix}, or pip install the project beside a torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flexkv_adapter.cli.samples import SAMPLES
from flexkv_adapter.errors import AdapterError
from flexkv_adapter.flexkv.plan import plan
from flexkv_adapter.pipeline.adapting import adapt

from gpu_check_copy import check_zero_copy, raw_bytes, roots, stride_blind_copy  # isort: skip
from gpu_check_share import share_with_child  # isort: skip
from gpu_check_sleep import sleep_check  # isort: skip

__all__ = [
    "check_zero_copy",
    "failures",
    "main",
    "raw_bytes",
    "roots",
    "run",
    "share_with_child",
    "stride_blind_copy",
    "verdict",
]


def big_pool(device: torch.device, gib: float) -> dict[str, Any]:
    """Time adapt() (and plan()) on a flat [L, 2, N, H, D] bf16 pool of ``gib`` GiB."""
    layers, heads, dim, page = 64, 8, 128, 16
    rows = int(gib * 2**30) // (layers * 2 * heads * dim * 2) + 7  # not a multiple of the page
    need = layers * 2 * rows * heads * dim * 2
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if free < need + 2**30:
            return {"skipped": f"needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"}
    pool = torch.empty(layers, 2, rows, heads, dim, dtype=torch.bfloat16, device=device)
    allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    start = time.perf_counter()
    view = adapt(pool, page_size=page, layer_num=layers, head_num=heads, head_dim=dim)
    adapt_s = time.perf_counter() - start
    start = time.perf_counter()
    p = plan(view)
    plan_s = time.perf_counter() - start
    after = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    result = {
        "pool_gib": round(need / 2**30, 3),
        "adapt_s": round(adapt_s, 6),
        "plan_s": round(plan_s, 6),
        "tensors": len(p.tensors),
        "bytes_copied": view.report.bytes_copied,
        "memory_allocated_before": allocated,
        "memory_allocated_after": after,
        "new_allocation_bytes": None if after is None or allocated is None else after - allocated,
    }
    del view, p, pool
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def run(device: torch.device, big_gib: float, child_timeout_s: float) -> dict[str, Any]:
    use_triton = False
    if device.type == "cuda":
        try:
            import triton  # noqa: F401

            use_triton = True
        except ImportError:
            pass
    results: dict[str, Any] = {"device": str(device), "kernel": "triton" if use_triton else "torch-gather", "pools": {}}
    gen = torch.Generator(device="cpu").manual_seed(0)
    shared: list[torch.Tensor] = []
    with torch.device(device):
        for sample in SAMPLES:
            if sample.refused_with:
                continue
            entry: dict[str, Any] = {}
            results["pools"][sample.name] = entry
            try:
                pool = sample.build()
                pool_roots = roots(pool)
                for r in pool_roots:
                    raw = raw_bytes(r)
                    noise = torch.randint(0, 256, (raw.numel(),), generator=gen, dtype=torch.uint8, device="cpu")
                    raw.copy_(noise.to(device))
                view = adapt(pool, **sample.options)
                entry["zero_copy"] = check_zero_copy(view, pool_roots)
                entry["copy"] = [stride_blind_copy(view, pool_roots, w, use_triton) for w in (8, 16)]
                try:
                    entry["plan"] = str(plan(view))
                except AdapterError as exc:
                    entry["plan"] = f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                # said in the output itself: a refusal here is the right answer only where the sample says why
                entry["plan_expected"] = f"refused: {sample.plan_refusal}" if sample.plan_refusal else "planned"
                shared += view.tensors()
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
    try:
        results["share"] = share_with_child(shared, child_timeout_s)
    except Exception as exc:
        results["share"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        results["big_pool"] = big_pool(device, big_gib)
    except Exception as exc:
        results["big_pool"] = {"error": f"{type(exc).__name__}: {exc}"}
    results["sleep"] = sleep_check(device)
    results["failures"] = failures(results)
    results["ok"] = not results["failures"]
    return results


def failures(results: dict[str, Any]) -> list[str]:
    out = []
    for name, entry in results["pools"].items():
        if "error" in entry:
            out.append(f"{name}: {entry['error']}")
            continue
        out += [f"{name}: {f}" for f in entry["zero_copy"]["failures"]]
        if entry["plan"].startswith("refused") != entry["plan_expected"].startswith("refused"):
            out.append(f"{name}: plan() {entry['plan'][:80]!r}, expected {entry['plan_expected'][:80]!r}")
        for c in entry["copy"]:
            if c["mismatches"] or c["faults"]:
                out.append(f"{name}: {c['word_bytes']}-byte copy: {c['mismatches']} mismatches, {c['faults']} faults")
    share = results["share"]
    if "error" in share or share.get("mismatched"):
        out.append(f"share: {share.get('error') or share['mismatched']}")
    big = results["big_pool"]
    if "error" in big or big.get("bytes_copied") or big.get("new_allocation_bytes"):
        out.append(f"big_pool: {big}")
    return out + [f"sleep: {f}" for f in results.get("sleep", {}).get("failures", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--big-gib", type=float, default=None, help="big pool size (default 100 on CUDA, 0.05 on CPU)")
    parser.add_argument("--child-timeout-s", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    big = args.big_gib if args.big_gib is not None else (100.0 if cuda else 0.05)
    start = time.perf_counter()
    results = run(device, big, args.child_timeout_s)
    results["wall_s"] = round(time.perf_counter() - start, 3)
    results["gpu"] = torch.cuda.get_device_name(device) if cuda else None
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)
    sys.stdout.flush()  # the verdict comes after the JSON, also where both go to one terminal or file
    print(f"gpu_check: {verdict(results['failures'])}", file=sys.stderr)
    return 0 if results["ok"] else 1


def verdict(found: list[str]) -> str:
    """``ok``, or how many checks failed (their lines are the JSON's ``failures``)."""
    return "ok" if not found else f"{len(found)} failure{'s' if len(found) > 1 else ''}"


if __name__ == "__main__":
    sys.exit(main())
