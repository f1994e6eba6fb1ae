"""``flexkv.c_ext.transfer_kv_blocks`` on CPU, written from FlexKV's csrc/transfer.cu and gtensor_handler.cuh.

The one stand-in for FlexKV's copy kernel (shared/reference/serving_paths.md §0): byte strides and the
chunk become 8-byte word counts by integer division, the tail ``chunk % 8`` is never copied, the GPU
address is picked per backend type, and a 16-byte chunk needs 16-byte aligned bases (the GPU faults
otherwise). Every access must land inside a registered tensor or the CPU cache.
"""

from __future__ import annotations

from typing import Any

import torch

WORD = 8


def window(tensors: list[torch.Tensor], addr: int, n: int) -> torch.Tensor:
    """The ``n`` bytes at ``addr`` inside one of ``tensors``' storages; outside or past the end raises."""
    for t in tensors:
        storage = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        start = addr - storage.data_ptr()
        if 0 <= start < storage.numel():
            past = start + n - storage.numel()
            assert past <= 0, f"the kernel would run {past} bytes past the end of a registered buffer"
            return storage[start : start + n]
    raise AssertionError(f"the kernel would access {addr:#x}, outside every registered tensor")


def _aligned(gpu_addr: int, cpu_addr: int, chunk: int) -> None:
    """transfer.cu picks 16-byte ld/st when ``chunk % 16 == 0`` (else 8-byte): misaligned, the GPU faults."""
    need = 16 if chunk % 16 == 0 else WORD
    bad = [f"{side} {addr:#x}" for side, addr in (("GPU", gpu_addr), ("CPU", cpu_addr)) if addr % need]
    assert not bad, f"misaligned address: {bad} not {need}-byte aligned for a {chunk}-byte chunk"


def kernel(registered: list[torch.Tensor]) -> Any:
    """``c_ext.transfer_kv_blocks``: 8-byte words, integer-divided strides, pointer per backend type."""

    def transfer_kv_blocks(gpu_ids, gpu_ptrs, gpu_kv, gpu_block, gpu_layer, cpu_ids, cpu, cpu_kv, cpu_layer,
                           cpu_block, chunk, start_layer, num_layers, _cta, h2d, _ce, kv_dim, _heads, block_type,
                           *_: Any, **__: Any) -> None:  # fmt: skip
        ptrs, words = [int(p) for p in gpu_ptrs], chunk // WORD
        gk, gb, gl = gpu_kv // WORD, gpu_block // WORD, gpu_layer // WORD
        ck, cb, cl = cpu_kv // WORD, cpu_block // WORD, cpu_layer // WORD
        for layer in range(start_layer, start_layer + num_layers):
            for g, c in zip(gpu_ids.tolist(), cpu_ids.tolist()):
                for kv in range(kv_dim):
                    if block_type == 2:  # SGLang
                        gpu_addr = ptrs[kv * num_layers + layer] + g * gb * WORD
                    elif block_type == 0:  # vLLM
                        gpu_addr = ptrs[layer] + (kv * gk + g * gb) * WORD
                    else:  # TRT-LLM
                        gpu_addr = ptrs[0] + (g * gb + layer * gl + kv * gk) * WORD
                    cpu_addr = cpu.data_ptr() + (layer * cl + kv * ck + c * cb) * WORD
                    _aligned(gpu_addr, cpu_addr, chunk)
                    gpu_w = window(registered, gpu_addr, words * WORD)
                    cpu_w = window([cpu], cpu_addr, words * WORD)
                    (gpu_w if h2d else cpu_w).copy_(cpu_w if h2d else gpu_w)

    return transfer_kv_blocks
