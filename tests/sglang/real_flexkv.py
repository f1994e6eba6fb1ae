"""FlexKV's real Python (``tests.flexkv_source.find()``), with only its GPU and compiled parts replaced.

``SOURCE`` is the one answer for the tier: the FlexKV tree found (FLEXKV_SOURCE, an installed flexkv,
or ../shared/flexkv-34ab141), or "" with ``SKIP_REASON`` saying how to point at one. It is read at
import, before any fixture puts a stand-in ``flexkv`` tree on ``sys.path`` (which the finder would
otherwise take for an installed FlexKV).
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
import types
from typing import Any

import pytest
import torch

from tests.flexkv_source import find

from . import flexkv_standin as fk
from .flexkv_serving import DataKVManager

_FOUND = find()
SOURCE = str(_FOUND.root) if _FOUND.root else ""
SKIP_REASON = _FOUND.skip_reason
needs_flexkv = pytest.mark.skipif(not SOURCE, reason=SKIP_REASON)


class _Anything(types.ModuleType):
    """A compiled or GPU-only module: any name is a class that accepts anything."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


def _nvtx() -> types.ModuleType:
    module = types.ModuleType("nvtx")
    module.annotate = lambda *a, **k: a[0] if a and callable(a[0]) else _NoRange()  # type: ignore[attr-defined]
    return module


class _NoRange:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, fn):
        return fn


def _expiring_dict() -> types.ModuleType:
    module = types.ModuleType("expiring_dict")
    module.ExpiringDict = type("ExpiringDict", (dict,), {"__init__": lambda self, *a, **k: dict.__init__(self)})  # type: ignore[attr-defined]
    return module


class _Client:
    """KVTPClient: records what this rank registers (the data plane copies from it)."""

    def __init__(self, *args, **kwargs):
        pass

    def register_to_server(self, kv_caches, kv_layout, override_device_id=None, **kwargs):
        fk.CALLS.append(("register_to_server", dict(kv_caches=list(kv_caches), kv_layout=kv_layout, **kwargs)))


def prepare(monkeypatch: Any, source: str) -> None:
    """Before the plugin loads: FlexKV's source on the path, stand-ins for what cannot be imported on CPU."""
    monkeypatch.syspath_prepend(source)
    monkeypatch.setitem(sys.modules, "flexkv.c_ext", _Anything("flexkv.c_ext"))
    for name, make in (("nvtx", _nvtx), ("expiring_dict", _expiring_dict)):
        if importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, make())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the connector ignores SIGINT for the process


def replace_gpu_parts(monkeypatch: Any) -> Any:
    """FlexKV's connector module with KVManager and KVTPClient replaced by the CPU data plane."""
    connector = importlib.import_module("flexkv.integration.sglang.connector")
    monkeypatch.setattr(connector, "KVManager", DataKVManager)
    monkeypatch.setattr(connector, "KVTPClient", _Client)
    return connector
