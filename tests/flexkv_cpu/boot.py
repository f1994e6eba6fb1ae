"""FlexKV's compiled and CUDA parts on CPU in EVERY process of an engine run (``site/sitecustomize.py``).

FlexKV's real Python runs in several processes: the engine's (connector, KVManager, task and cache
engines), the TransferManager FlexKV spawns, and the transfer workers that spawns. A spawned process
starts a fresh interpreter, so monkeypatching one process replaces nothing in the others. With
``tests/flexkv_cpu/site`` on ``PYTHONPATH`` and ``FLEXKV_CPU=1`` every interpreter calls
:func:`install` at start-up, which

* serves ``flexkv.c_ext`` from :mod:`tests.flexkv_cpu.c_ext`: FlexKV's compiled module where the tree has
  one (its copy kernel replaced, with counters), else stand-ins (copy kernel, hashing, counters);
* replaces, the moment FlexKV's module is imported, only what needs CUDA: ``KVTPClient``'s CUDA IPC
  registration (:mod:`tp_client`), ``cudaHostRegister``/unregister and ``ensure_cuda_device`` in the
  transfer worker (FlexKV's own code calls them before any copy);
* makes ``Tensor.pin_memory``, ``pin_memory=True``, ``torch.cuda.Stream``/``current_device``/``synchronize``
  harmless on a machine without a GPU (FlexKV's worker pins op buffers and opens a stream; on CPU nothing to do).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .compiled import compiled_ext

ENABLED = "FLEXKV_CPU"


def _client(module: types.ModuleType) -> None:
    from .tp_client import cpu_client_class

    module.KVTPClient = cpu_client_class(module.KVTPClient)  # type: ignore[attr-defined]


def _worker(module: types.ModuleType) -> None:
    for name in ("cudaHostRegister", "safe_cuda_host_unregister", "ensure_cuda_device"):
        setattr(module, name, lambda *a, **k: None)


def _host_buffer(module: types.ModuleType) -> None:
    module.cudaHostRegister = lambda *a, **k: None  # type: ignore[attr-defined]
    module.safe_cuda_host_unregister = lambda *a, **k: None  # type: ignore[attr-defined]


AFTER_IMPORT: dict[str, Callable[[types.ModuleType], None]] = {
    "flexkv.server.client": _client,
    "flexkv.transfer.host_buffer": _host_buffer,
    "flexkv.transfer.worker": _worker,
}


class _Patched(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[types.ModuleType], None]) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _CExtLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        from .c_ext import module

        return module()

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class Finder(importlib.abc.MetaPathFinder):
    """Serves ``flexkv.c_ext``; patches FlexKV's CUDA-bound modules right after they execute."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name == "flexkv.c_ext":
            return importlib.machinery.ModuleSpec(name, _CExtLoader())
        if name not in AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, Finder) or not hasattr(finder, "find_spec"):  # two would ask each other forever
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader, AFTER_IMPORT[name])
                return spec
        return None


class _NoStream:
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, *a: Any) -> None:
        pass


def _unpinned(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return make(*args, **kwargs)

    return unpinned


def _torch_without_gpu(put: Callable[[Any, str, Any], None] = setattr) -> None:
    if torch.cuda.is_available():
        return
    put(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    for name in ("zeros", "empty"):  # FlexKV's worker asks for pinned pointer tables
        put(torch, name, _unpinned(getattr(torch, name)))
    put(torch.cuda, "Stream", _NoStream)
    put(torch.cuda, "current_device", lambda: 0)
    put(torch.cuda, "synchronize", lambda *a, **k: None)


def install() -> None:
    """Once per interpreter, when ``FLEXKV_CPU=1``."""
    if os.environ.get(ENABLED) != "1" or any(isinstance(f, Finder) for f in sys.meta_path):
        return
    os.environ.setdefault("FLEXKV_ENABLE_MPS", "0")
    if compiled_ext() is None:  # the stand-ins have no compiled radix index: FlexKV's Python one, always
        os.environ["FLEXKV_INDEX_ACCEL"] = "0"
    sys.meta_path.insert(0, Finder())
    _torch_without_gpu()


def install_for_test(monkeypatch: Any, flexkv_source: str) -> None:
    """The same in a test process, undone with ``monkeypatch``; FlexKV's spawned processes boot from the env."""
    repo = str(Path(__file__).resolve().parents[2])
    site = str(Path(__file__).resolve().parent / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, site, flexkv_source]))
    for name, value in ((ENABLED, "1"), ("FLEXKV_ENABLE_MPS", "0")):
        monkeypatch.setenv(name, value)
    if compiled_ext([flexkv_source]) is None:
        monkeypatch.setenv("FLEXKV_INDEX_ACCEL", "0")
    else:
        monkeypatch.delenv("FLEXKV_INDEX_ACCEL", raising=False)  # FlexKV's default: its compiled index
    if not any(isinstance(f, Finder) for f in sys.meta_path):  # a spawned child's start-up hook put one there
        monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    _torch_without_gpu(monkeypatch.setattr)
