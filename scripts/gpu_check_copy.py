"""gpu_check parts 1 and 3: zero-copy through the adapted views, and FlexKV's stride-blind block copy.

Part 1 writes a marker block through each view tensor and finds it, and only it, in the pool's own
allocation. Part 3 gathers every registered block the way FlexKV's workers address it
(``data_ptr + b * block_bytes``, in 8- and 16-byte words, ignoring strides) straight from the
allocation, with a Triton kernel when Triton and CUDA are present, else one torch gather.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


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
