"""gpu_check part 5: vLLM sleep mode and the plugin's re-registration on wake (needs CUDA and vLLM).

vLLM 0.33 sleeps by unmapping its KV memory (``CuMemAllocator``, tag ``kv_cache``) and wakes by
mapping new pages at the same virtual addresses (gpu_worker.py:319-371). The plugin forwards
``unregister_kv_caches`` / ``restore_kv_caches`` to FlexKV's ``before_device_sleep`` /
``after_device_wake``, which re-registers the tensors it kept. That is right only if, after wake,
those tensors address the woken memory and the adapted registration is the same. This check
allocates a vLLM-shaped (LBNHC) KV cache in vLLM's own pool, plans it as the plugin's ``_register``
does (no FlexKV needed), sleeps and wakes it, plans it again, and compares pointers,
layout and a marker block written through the registered tensors and read through vLLM's views.
Without CUDA or vLLM it reports ``skipped`` with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from flexkv_adapter.integrations.vllm.plugin import _plan

LAYERS, BLOCKS, TOKENS, HEADS, HEAD = 4, 64, 16, 8, 128
FACTS = {"kind": "mha", "heads": HEADS, "content": 2 * HEAD, "block_size": TOKENS}


def registration(kv_caches: dict[str, torch.Tensor], resume: bool) -> dict[str, Any]:
    """What the plugin's ``_register`` hands FlexKV (the plan's tensors and layout), without FlexKV."""
    p, _ = _plan(kv_caches, FACTS, 1)
    return {"ptrs": [t.data_ptr() for t in p.tensors], "layout": repr(p), "resume": resume}


def vllm_kv_caches(device: torch.device) -> dict[str, torch.Tensor]:
    """vLLM 0.33's LBNHC dict: one buffer [L, B, T, H, 2D]; per layer a [B, H, T, 2D] view."""
    raw = torch.empty(LAYERS, BLOCKS, TOKENS, HEADS, 2 * HEAD, dtype=torch.bfloat16, device=device)
    return {f"model.layers.{i}.self_attn.attn": raw[i].permute(0, 2, 1, 3) for i in range(LAYERS)}


def register_twice(kv_caches: dict[str, torch.Tensor], between: Any) -> dict[str, Any]:
    """Register, run ``between`` (sleep and wake), re-register what it returns, as after_device_wake does.

    ``between`` gets the tensors the registration kept and returns those FlexKV re-registers.
    """
    before = registration(kv_caches, resume=False)
    ptrs = [t.data_ptr() for t in kv_caches.values()]
    kept = between(dict(kv_caches))  # FlexKV's worker keeps the dict it registered (adp:962)
    after = registration(kept, resume=True)
    failures = []
    if [t.data_ptr() for t in kept.values()] != ptrs:
        failures.append("the kept KV tensors moved across sleep/wake")
    if before["layout"] != after["layout"] or before["ptrs"] != after["ptrs"] or not after["resume"]:
        failures.append(f"re-registration differs: {before} vs {after}")
    view = next(iter(kv_caches.values()))
    marker = torch.full((TOKENS, HEADS, 2 * HEAD), 3.0, dtype=view.dtype, device=view.device)
    view[BLOCKS - 1].copy_(marker.permute(1, 0, 2))  # vLLM writes block B-1 of layer 0 after wake
    registered = kept[next(iter(kept))]
    if not torch.equal(registered[BLOCKS - 1].permute(1, 0, 2).float(), marker.float()):
        failures.append("after wake the registered tensor does not address vLLM's KV memory")
    return {"layout": str(after["layout"]), "failures": failures}


def sleep_check(device: torch.device) -> dict[str, Any]:
    """The sleep/wake round on vLLM's CuMemAllocator; ``skipped`` (with why) without CUDA or vLLM."""
    if device.type != "cuda":
        return {"skipped": "needs CUDA: vLLM's sleep mode unmaps GPU memory", "failures": []}
    try:
        from vllm.device_allocator.cumem import CuMemAllocator
    except Exception as exc:
        return {"skipped": f"vLLM's CuMemAllocator is not importable ({type(exc).__name__}: {exc})", "failures": []}
    try:
        allocator = CuMemAllocator.get_instance()
        with allocator.use_memory_pool(tag="kv_cache"):
            kv_caches = vllm_kv_caches(device)

        def sleep_and_wake(kept: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            allocator.sleep(offload_tags=())
            allocator.wake_up(tags=["kv_cache"])
            return kept

        return register_twice(kv_caches, sleep_and_wake)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "failures": [f"{type(exc).__name__}: {exc}"]}
