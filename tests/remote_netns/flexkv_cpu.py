"""FlexKV's real Python in a process of its own, compiled parts replaced.

The source tree is the one ``tests/flexkv_source.py`` finds (e.g. ../shared/flexkv-34ab141).

Imported first thing by the master script (node A) and, as ``transfer_manager``, by start_remote
(node B). ``flexkv.c_ext`` (C++/CUDA) becomes a module whose every name is an inert class; ``nvtx``,
``expiring_dict``, ``psutil`` and ``requests`` (FlexKV's dependencies, not installed here) get minimal stand-ins
only where they are missing. Everything else, the master's ``TransferManagerMultiNodeHandle`` and
the remote's ``TransferManagerOnRemote`` (connect, config, register sockets, GPU registration,
polling worker), is FlexKV's own code. :class:`CPURemote` replaces only what follows the
registration: ``StorageEngine`` (pinned CPU cache) and ``TransferEngine`` (CUDA transfer workers).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections import namedtuple
from pathlib import Path
from typing import Any

from ..flexkv_source import find


def source() -> Path:
    """FlexKV's source tree by the tests' one rule (``tests/flexkv_source.py``); the tier passes the
    test process's answer to every node's processes as ``FLEXKV_SOURCE``."""
    found = find()
    if found.root is None:
        raise RuntimeError(found.skip_reason)
    return found.root


class _Anything(types.ModuleType):
    """A compiled module: any name is a class that accepts anything."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class _NoRange:
    def __enter__(self) -> _NoRange:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def __call__(self, fn: Any) -> Any:
        return fn


def _stand_ins() -> dict[str, types.ModuleType]:
    nvtx = types.ModuleType("nvtx")
    nvtx.annotate = lambda *a, **k: a[0] if a and callable(a[0]) else _NoRange()  # type: ignore[attr-defined]
    nvtx.push_range = nvtx.pop_range = lambda *a, **k: None  # type: ignore[attr-defined]
    expiring = types.ModuleType("expiring_dict")
    expiring.ExpiringDict = type(  # type: ignore[attr-defined]
        "ExpiringDict", (dict,), {"__init__": lambda self, *a, **k: dict.__init__(self)}
    )
    psutil = types.ModuleType("psutil")
    memory = namedtuple("memory", "total available")

    def virtual_memory() -> Any:  # what FlexKV's get_zmq_socket reads to size its buffers
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = {k: int(v.split()[0]) * 1024 for k, v in info.items() if v.split()}
        return memory(kib["MemTotal"], kib.get("MemAvailable", kib["MemFree"]))

    psutil.virtual_memory = virtual_memory  # type: ignore[attr-defined]
    requests = _Anything("requests")  # imported by FlexKV's Mooncake helpers, never called here
    return {"nvtx": nvtx, "expiring_dict": expiring, "psutil": psutil, "requests": requests}


def load() -> types.ModuleType:
    """``flexkv.transfer_manager``, FlexKV's own, importable on a CPU-only machine."""
    root = source()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    sys.modules.setdefault("flexkv.c_ext", _Anything("flexkv.c_ext"))
    for name, module in _stand_ins().items():
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = module
    import flexkv.transfer_manager as tm

    assert Path(tm.__file__).resolve().is_relative_to(root), tm.__file__
    return tm
