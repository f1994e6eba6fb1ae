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
from typing import Any

import pytest
import torch

from tests.flexkv_cpu import c_ext
from tests.flexkv_source import find

from . import flexkv_standin as fk
from .flexkv_serving import DataKVManager

_FOUND = find()
# FlexKV's own pure-Python requirements (real, not stood in); xxhash serves the hashing stand-in
_MISSING = [m for m in ("nvtx", "expiring_dict", "xxhash") if importlib.util.find_spec(m) is None]
SOURCE = str(_FOUND.root) if _FOUND.root and not _MISSING else ""
SKIP_REASON = _FOUND.skip_reason or (
    f"FlexKV's requirements {_MISSING} are not installed; run scripts/install_sglang_cpu.sh" if _MISSING else ""
)
needs_flexkv = pytest.mark.skipif(not SOURCE, reason=SKIP_REASON)


class _Client:
    """KVTPClient: records what this rank registers (the data plane copies from it)."""

    def __init__(self, *args, **kwargs):
        pass

    def register_to_server(self, kv_caches, kv_layout, override_device_id=None, **kwargs):
        fk.CALLS.append(("register_to_server", dict(kv_caches=list(kv_caches), kv_layout=kv_layout, **kwargs)))


def prepare(monkeypatch: Any, source: str) -> None:
    """Before the plugin loads: FlexKV's source on the path, its compiled extension stood in (tests/flexkv_cpu)."""
    monkeypatch.syspath_prepend(source)
    monkeypatch.setitem(sys.modules, "flexkv.c_ext", c_ext.module())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the connector ignores SIGINT for the process


def replace_gpu_parts(monkeypatch: Any) -> Any:
    """FlexKV's connector module with KVManager and KVTPClient replaced by the CPU data plane."""
    connector = importlib.import_module("flexkv.integration.sglang.connector")
    monkeypatch.setattr(connector, "KVManager", DataKVManager)
    monkeypatch.setattr(connector, "KVTPClient", _Client)
    return connector
