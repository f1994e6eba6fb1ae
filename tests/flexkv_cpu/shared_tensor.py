"""CPU stand-in for FlexKV's ``TensorSharedHandle`` (flexkv/common/memory_handle.py, 34ab141).

On a GPU, ``KVTPClient`` wraps each KV tensor in a CUDA IPC handle and FlexKV's transfer workers (other
processes) map the SAME memory with ``get_tensor()``. On CPU the same sharing is a file in shared
memory: :func:`share` moves a tensor's storage into a file in place (the engine keeps using its tensor
object, now backed by the file), and :class:`CpuTensorHandle` maps that file again in any process.
Every tensor a process maps is kept in ``c_ext.MAPPED`` (the copy-kernel stand-in checks that each of
its accesses lands inside one of them). ``device`` is ``cpu``, so FlexKV's ``ensure_cuda_device``
binds nothing.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from flexkv.common.memory_handle import TensorSharedHandle  # type: ignore[import-not-found]

from .c_ext import MAPPED

_COUNTER = itertools.count()


def shm_dir() -> Path:
    path = Path(os.environ.get("FLEXKV_CPU_SHM_DIR", "/dev/shm"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _map(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def share(tensor: torch.Tensor) -> str:
    """Move ``tensor``'s whole storage into a shared-memory file, in place; returns the file's path."""
    if getattr(tensor, "_flexkv_cpu_path", None):  # registered again (a resume): the same file
        return str(tensor._flexkv_cpu_path)  # type: ignore[attr-defined]
    storage = tensor.untyped_storage()
    path = str(shm_dir() / f"flexkv_cpu_{os.getpid()}_{next(_COUNTER)}")
    with open(path, "wb") as f:
        f.truncate(storage.nbytes())
    mapped = _map(path, storage.nbytes())
    mapped.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
    tensor.set_(mapped.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
    tensor._flexkv_cpu_path = path  # type: ignore[attr-defined]
    return path


@dataclass(init=False)
class CpuTensorHandle(TensorSharedHandle):  # type: ignore[misc]
    """A ``TensorSharedHandle`` (FlexKV checks the type) whose ``get_tensor()`` maps the shared file."""

    path: str = ""
    nbytes: int = 0
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()

    def __init__(self, tensor: torch.Tensor) -> None:  # FlexKV's __init__ exports CUDA IPC: not called
        if tensor.is_cuda:
            raise ValueError("CpuTensorHandle stands in for CUDA IPC on CPU only")
        self.path = share(tensor)
        self.nbytes = tensor.untyped_storage().nbytes()
        self.shape, self.stride, self.offset = tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
        self.tensor_dtype, self.tensor_shape, self.tensor_numel = tensor.dtype, self.shape, tensor.numel()
        self.device, self.handle_type = torch.device("cpu"), "cpu_shared_file"
        self.rebuild_func = self.rebuild_args = self.ipc_handle = None
        self.use_direct_ipc, self.vmm_allocation_size, self.vmm_granularity = False, 0, 0

    @classmethod
    def of(cls, tensor: torch.Tensor) -> CpuTensorHandle:
        return cls(tensor)

    def get_tensor(self) -> torch.Tensor:
        base = _map(self.path, self.nbytes)
        out = torch.empty(0, dtype=self.tensor_dtype).set_(base.untyped_storage(), self.offset, self.shape, self.stride)
        MAPPED.append(out)
        return out

    def release_exported_vmm_handle(self) -> None:
        pass  # nothing exported: the file stays until the run's shared-memory folder is removed
