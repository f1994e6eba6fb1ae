"""The bridge against FlexKV's REAL connector Python (opt-in: ``FLEXKV_SOURCE`` = a FlexKV checkout).

Only what needs a GPU or FlexKV's compiled extension is replaced: ``KVManager`` and ``KVTPClient``
(by the data plane of ``flexkv_serving``), ``torch.cuda.current_device``, and the modules
``flexkv.c_ext``, ``nvtx`` and ``expiring_dict`` when they cannot be imported. For example::

    git -C <FlexKV mirror> archive 34ab141 flexkv | tar x -C /tmp/fk
    FLEXKV_SOURCE=/tmp/fk pytest tests/sglang/test_sglang_bridge_real.py
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import types
from pathlib import Path

import pytest
import torch

from flexkv_adapter.integrations.sglang_bridge import BridgeConnector

from . import flexkv_standin as fk
from .flexkv_serving import DataKVManager
from .radix_harness import Rig, read
from .test_sglang_bridge import IDS, _served

SOURCE = os.environ.get("FLEXKV_SOURCE", "")
pytestmark = pytest.mark.skipif(
    not (Path(SOURCE) / "flexkv/integration/sglang/connector.py").is_file(),
    reason="set FLEXKV_SOURCE to a FlexKV checkout to run the bridge against FlexKV's real connector",
)


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


@pytest.fixture
def real_flexkv(sglang_env, monkeypatch):
    monkeypatch.syspath_prepend(SOURCE)
    monkeypatch.setitem(sys.modules, "flexkv.c_ext", _Anything("flexkv.c_ext"))
    for name, make in (("nvtx", _nvtx), ("expiring_dict", _expiring_dict)):
        if importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, make())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the connector ignores SIGINT for the process
    sglang_env.load()
    connector = importlib.import_module("flexkv.integration.sglang.connector")
    monkeypatch.setattr(connector, "KVManager", DataKVManager)
    monkeypatch.setattr(connector, "KVTPClient", _Client)
    return connector


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_store_evict_restore_through_flexkv_real_connector(real_flexkv, models, monkeypatch, kind):
    rig = Rig(monkeypatch, models["llama" if kind == "mha" else "deepseek"], kind)
    bridge = rig.cache.flexkv_connector
    assert isinstance(bridge, BridgeConnector) and type(bridge.connector).__module__ == real_flexkv.__name__
    req, expected, loaded, slots, blocker, before = _served(rig)
    assert loaded == len(IDS) and not set(slots.tolist()) & set(req.slots.tolist())
    assert read(rig.pool, slots) == expected and read(rig.pool, blocker) == before


def test_retry_with_a_new_attempt_through_flexkv_real_connector(real_flexkv, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    rig.finish(rig.request("r1", IDS, prompt=40, seed=1))
    rig.finish(rig.request("r1", IDS[:32] + list(range(2000, 2016)), prompt=40, attempt=1, seed=2))
    assert set(rig.cache.flexkv_connector.connector._inflight_stores) == {"r1@attempt0", "r1@attempt1"}
    for _ in range(2):
        rig.cache.check_hicache_events()
    assert not rig.cache._inflight_store_nodes and rig.evict_all() == 64
