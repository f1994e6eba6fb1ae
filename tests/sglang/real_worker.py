"""FlexKV's real ``GPUCPUTransferWorker`` on CPU, with only its copy kernel replaced (opt-in: ``FLEXKV_SRC``).

``FLEXKV_SRC`` names a FlexKV source tree (e.g. ``git archive`` of 34ab141's ``flexkv/``). Its
Python runs as is; what needs a GPU is shimmed: the compiled ``flexkv.c_ext`` (``transfer_kv_blocks``
below, written from csrc/transfer.cu and gtensor_handler.cuh), ``nvtx``, CUDA device binding,
host registration, pinned memory and streams. Tensors are passed where FlexKV imports CUDA IPC
handles. Every access must land inside a registered tensor or the CPU cache.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

WORD = 8


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


def _window(tensors: list[torch.Tensor], addr: int, n: int) -> torch.Tensor:
    for t in tensors:
        storage = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        start = addr - storage.data_ptr()
        if 0 <= start < storage.numel():
            past = start + n - storage.numel()
            assert past <= 0, f"the kernel would run {past} bytes past a buffer"
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
                    gpu_w = _window(registered, gpu_addr, words * WORD)
                    cpu_w = _window([cpu], cpu_addr, words * WORD)
                    (gpu_w if h2d else cpu_w).copy_(cpu_w if h2d else gpu_w)

    return transfer_kv_blocks


@contextlib.contextmanager
def flexkv_worker_module() -> Iterator[Any]:
    """Import FlexKV's worker from ``FLEXKV_SRC`` with the GPU-only parts shimmed; undo on exit."""
    src = os.environ["FLEXKV_SRC"]
    saved = {n: m for n, m in sys.modules.items() if n == "flexkv" or n.startswith("flexkv.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, src)
    sys.modules["nvtx"] = sys.modules.get("nvtx") or _Stub("nvtx")
    sys.modules["flexkv.c_ext"] = _Stub("flexkv.c_ext")
    real_zeros, real_pin, real_stream = torch.zeros, torch.Tensor.pin_memory, torch.cuda.Stream
    try:
        import flexkv.transfer.worker as worker

        torch.zeros = lambda *a, pin_memory=False, **k: real_zeros(*a, **k)  # type: ignore[assignment]
        torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
        torch.cuda.Stream = lambda *a, **k: None  # type: ignore[assignment,misc]
        worker.ensure_cuda_device = lambda *a, **k: None
        worker.cudaHostRegister = lambda *a, **k: None
        worker.import_tensor_handles = lambda handles: list(handles)
        worker.materialize_worker_tensor = lambda t: t
        yield worker
    finally:
        torch.zeros, torch.Tensor.pin_memory, torch.cuda.Stream = real_zeros, real_pin, real_stream  # type: ignore[assignment,misc]
        sys.path.remove(src)
        for name in [n for n in sys.modules if n == "flexkv" or n.startswith("flexkv.")]:
            del sys.modules[name]
        sys.modules.update(saved)


class RealWorker:
    """What the server builds from a registration and ``ModelConfig.layer_groups``: the real worker."""

    def __init__(self, module: Any, call: dict[str, Any], layer_groups: list[Any], num_cpu_blocks: int):
        from flexkv.common.storage import KVCacheLayout, KVCacheLayoutType

        primary = call["kv_layout"]
        cpu_layout = KVCacheLayout(
            type=KVCacheLayoutType.BLOCKFIRST,
            num_layer=primary.num_layer,
            num_block=num_cpu_blocks,
            tokens_per_block=primary.tokens_per_block,
            num_head=primary.num_head,
            head_size=primary.head_size,
            kv_dim=primary.kv_dim,
            num_kv_heads=primary.num_kv_heads,
            layer_groups=layer_groups,
        )
        self.cpu = torch.zeros(tuple(cpu_layout.kv_shape), dtype=torch.uint8)
        registered = [t for group in call["handles_per_group"] for t in group]
        module.transfer_kv_blocks = kernel(registered)
        self.worker = module.GPUCPUTransferWorker(
            0, None, None, torch.zeros(1), call["kv_caches"], self.cpu, primary, cpu_layout, torch.uint8, 0,
            layer_groups=layer_groups, gpu_blocks_per_group=call["handles_per_group"],
            gpu_layouts_per_group=call["gpu_layouts"],
        )  # fmt: skip
        self.types = sys.modules["flexkv.common.transfer"].TransferType

    def d2h(self, gpu_blocks: list[int], cpu_blocks: list[int]) -> None:
        ids = (torch.tensor(gpu_blocks, dtype=torch.int64), torch.tensor(cpu_blocks, dtype=torch.int64))
        self.worker._transfer_impl(*ids, self.types.D2H)

    def h2d(self, cpu_blocks: list[int], gpu_blocks: list[int]) -> None:
        ids = (torch.tensor(cpu_blocks, dtype=torch.int64), torch.tensor(gpu_blocks, dtype=torch.int64))
        self.worker._transfer_impl(*ids, self.types.H2D)
