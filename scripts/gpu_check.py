#!/usr/bin/env python3
"""Check on a GPU what FlexKV's workers will do with adapted views; without one, run the CPU parts.

1. Builds a pool of every supported kind (``flexkv_adapter.samples``) on the device, fills it with
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

    python scripts/gpu_check.py [--device auto|cuda|cpu] [--big-gib 100] [--out result.json]

Prints one JSON object; exits 0 when no check failed (skipped checks say why).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any

try:  # the wrong interpreter (system python): say which one to use instead of a traceback
    import pydantic_settings  # noqa: F401  (flexkv_adapter's own dependency)
    import torch
except ModuleNotFoundError as _missing:
    _fix = "Run `bash scripts/setup.sh`, then .venv/bin/python scripts/gpu_check.py (or activate .venv)"
    sys.exit(f"gpu_check.py: {_missing} in {sys.executable}. {_fix}, or pip install the project beside a torch")
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import reduce_tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flexkv_adapter.adapting import adapt
from flexkv_adapter.errors import AdapterError
from flexkv_adapter.flexkv.plan import plan
from flexkv_adapter.samples import SAMPLES

from gpu_check_sleep import sleep_check  # isort: skip


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole allocation behind ``t`` as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def roots(obj: object, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor reachable from a pool object (attributes, lists, dicts, dataclasses)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 4 or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.dtype)):
        return []
    if isinstance(obj, dict):
        items: list[object] = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif dataclasses.is_dataclass(obj):
        items = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    return [t for item in items for t in roots(item, depth + 1)]


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def owner(t: torch.Tensor, pool_roots: list[torch.Tensor]) -> torch.Tensor | None:
    base = t.untyped_storage().data_ptr()
    return next((r for r in pool_roots if r.untyped_storage().data_ptr() == base), None)


def check_zero_copy(view: Any, pool_roots: list[torch.Tensor]) -> dict[str, Any]:
    """Write a marker block through each view tensor and find it, and only it, in the pool's tensor."""
    failures = []
    for i, t in enumerate(view.tensors()):
        root = owner(t, pool_roots)
        if root is None:
            failures.append(f"tensor {i}: not inside any pool allocation")
            continue
        pool_bytes = raw_bytes(root)
        before = pool_bytes.clone()
        block = t[: view.page_size].view(torch.uint8)
        block.copy_(torch.arange(block.numel(), device=t.device).remainder(251).add(3).to(torch.uint8).view_as(block))
        start = t.data_ptr() - root.untyped_storage().data_ptr()
        seen = pool_bytes[start : start + block.numel()]
        changed = int((pool_bytes != before).sum())
        if not torch.equal(seen, block.reshape(-1)) or changed > block.numel():
            failures.append(f"tensor {i}: the pool does not hold the bytes written through the view")
        pool_bytes.copy_(before)
    return {"tensors": len(view.tensors()), "failures": failures}


def _gather_torch(flat: torch.Tensor, offsets: list[int], chunk: int, word: int) -> torch.Tensor:
    wtype = torch.int64 if word == 8 else torch.complex128
    words = flat[: flat.numel() - flat.numel() % word].view(wtype)
    index = torch.tensor([o // word for o in offsets], device=flat.device)[:, None]
    index = index + torch.arange(chunk // word, device=flat.device)[None, :]
    return words[index].view(torch.uint8).reshape(len(offsets), chunk - chunk % word)


_triton_kernel: Any = None


def _gather_triton(flat: torch.Tensor, offsets: list[int], chunk: int, word: int) -> torch.Tensor:
    """One program per chunk, loading int64 words at the chunk's raw address (16-byte words as pairs)."""
    global _triton_kernel
    import triton
    import triton.language as tl

    if _triton_kernel is None:

        @triton.jit
        def kernel(src, offs, dst, n_words, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
            c = tl.program_id(0)
            base = tl.load(offs + c)
            for i in range(0, n_words, BLOCK):
                idx = i + tl.arange(0, BLOCK)
                mask = idx < n_words
                tl.store(dst + c * n_words + idx, tl.load(src + base + idx, mask=mask), mask=mask)

        _triton_kernel = kernel
    words = flat[: flat.numel() - flat.numel() % 8].view(torch.int64)
    n_words = (chunk - chunk % word) // 8
    offs = torch.tensor([o // 8 for o in offsets], device=flat.device, dtype=torch.int64)
    out = torch.empty(len(offsets), n_words, dtype=torch.int64, device=flat.device)
    _triton_kernel[(len(offsets),)](words, offs, out, n_words, BLOCK=256)
    return out.view(torch.uint8)


def stride_blind_copy(view: Any, pool_roots: list[torch.Tensor], word: int, use_triton: bool) -> dict[str, Any]:
    """FlexKV's copy of block b of a registered tensor: ``chunk`` bytes at ``data_ptr + b * chunk``."""
    compared = faults = mismatches = unused = 0
    kernel_error = None
    for t in view.tensors():
        chunk = view.page_size * t.shape[1] * t.shape[2] * t.element_size()
        root = owner(t, pool_roots)
        flat = raw_bytes(t if root is None else root)
        offsets = [t.data_ptr() + b * chunk - flat.data_ptr() for b in range(view.num_blocks)]
        if chunk % word and word > 8:
            unused += len(offsets)  # FlexKV's kernel takes 8-byte words for this chunk size
            continue
        if chunk % word or any((flat.data_ptr() + o) % word for o in offsets):
            faults += len(offsets)  # the kernel would drop bytes (chunk) or fault (misaligned base)
            continue
        got = None
        if use_triton and kernel_error is None:
            try:
                got = _gather_triton(flat, offsets, chunk, word)
            except Exception as exc:  # report it and compare with the torch gather instead
                kernel_error = f"{type(exc).__name__}: {exc}"
        if got is None:
            got = _gather_torch(flat, offsets, chunk, word)
        for b in range(view.num_blocks):
            expected = t[b * view.page_size : (b + 1) * view.page_size].reshape(-1).view(torch.uint8)
            compared += 1
            mismatches += int(not torch.equal(got[b], expected))
    result = {"word_bytes": word, "chunks": compared, "faults": faults, "mismatches": mismatches, "unused": unused}
    return result | ({"triton_error": kernel_error} if kernel_error else {})


def _child(conn: Any, cuda: bool) -> None:
    """The second process: rebuild every shared tensor and describe what it sees."""
    try:
        payload = conn.recv()
        handles = pickle.loads(payload) if cuda else payload
        seen = []
        for func, args in handles:
            t = func(*args)
            seen.append(
                {
                    "sha256": digest(t),
                    "offset": t.data_ptr() - t.untyped_storage().data_ptr(),
                    "ptr": t.data_ptr(),
                    "shape": list(t.shape),
                    "stride": list(t.stride()),
                }
            )
        conn.send(seen)
    except Exception:  # report, never hang the parent
        conn.send(traceback.format_exc())


def share_with_child(tensors: list[torch.Tensor], timeout_s: float) -> dict[str, Any]:
    """Send reduce_tensor() handles to a spawned process; compare bytes, offsets, shapes."""
    cuda = tensors[0].is_cuda
    handles = [reduce_tensor(t) for t in tensors]  # CPU tensors move to shared memory here
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, cuda), daemon=True)
    proc.start()
    parent.send(pickle.dumps(handles) if cuda else handles)
    if not parent.poll(timeout_s):
        proc.kill()
        return {"error": f"the second process did not answer within {timeout_s} s"}
    seen = parent.recv()
    proc.join(10)
    if isinstance(seen, str):
        return {"error": seen}
    mismatched = [
        i
        for i, (t, s) in enumerate(zip(tensors, seen))
        if s["sha256"] != digest(t)
        or s["offset"] != t.data_ptr() - t.untyped_storage().data_ptr()
        or s["shape"] != list(t.shape)
        or s["stride"] != list(t.stride())
    ]
    same_ptr = sum(s["ptr"] == t.data_ptr() for t, s in zip(tensors, seen))
    transport = "pickled CUDA IPC handles" if cuda else "torch.multiprocessing (shared memory)"
    return {"tensors": len(tensors), "mismatched": mismatched, "same_virtual_address": same_ptr, "transport": transport}


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
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
