"""FlexKV's real ``GPUCPUTransferWorker`` on CPU, with only its copy kernel replaced.

FlexKV's source tree is the one ``tests.flexkv_source.find()`` gives (``real_flexkv.SOURCE``). Its
Python runs as is; what needs a GPU is shimmed: the compiled ``flexkv.c_ext`` (``transfer_kv_blocks``
below, written from csrc/transfer.cu and gtensor_handler.cuh), ``nvtx``, CUDA device binding,
host registration, pinned memory and streams. Tensors are passed where FlexKV imports CUDA IPC
handles. Every access must land inside a registered tensor or the CPU cache.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from tests.flexkv_cpu.kernel import kernel
from tests.flexkv_cpu.stubs import AnyNameModule

from .real_flexkv import SKIP_REASON, SOURCE


@contextlib.contextmanager
def flexkv_worker_module() -> Iterator[Any]:
    """Import FlexKV's worker from the tree found, with the GPU-only parts shimmed; undo on exit."""
    src = SOURCE
    assert src, SKIP_REASON
    saved = {n: m for n, m in sys.modules.items() if n == "flexkv" or n.startswith("flexkv.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, src)
    try:  # FlexKV's real requirement (install_sglang_cpu.sh); a stub left in sys.modules broke later tests
        import nvtx  # noqa: F401
    except ImportError:
        sys.modules["nvtx"] = AnyNameModule("nvtx")
    sys.modules["flexkv.c_ext"] = AnyNameModule("flexkv.c_ext")
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
