"""The bridge over FlexKV's REAL KVManager: nothing of FlexKV's Python is replaced, only its compiled parts.

SGLang 0.5.23's ``FlexKVRadixCache`` -> the plugin's bridge -> FlexKV's own connector -> FlexKV's
``KVManager``, task engine, Python radix index, ``TransferManager`` and transfer-worker processes
(spawned interpreters, booted by ``tests/flexkv_cpu/site``). The pool FlexKV's worker copies from is
SGLang's, shared with it through ``tests/flexkv_cpu/shared_tensor.py`` in place of CUDA IPC. FlexKV
completes stores asynchronously, so the scheduler's poll runs until the node is evictable (the
tests beside this one step a stand-in poll by poll). Negative control: FlexKV's CPU copy is zeroed
before the restore, and the restored bytes differ.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from tests.flexkv_cpu import boot
from tests.flexkv_cpu.counters import read_counters

from .radix_harness import Rig, read, zero
from .real_flexkv import SOURCE, needs_flexkv, prepare
from .test_sglang_bridge import IDS

pytestmark = needs_flexkv


@pytest.fixture
def flexkv(sglang_env, monkeypatch, tmp_path):
    """FlexKV's whole Python behind the plugin; the data plane's state folder is returned."""
    state, sockets = tmp_path / "state", Path(tempfile.mkdtemp(prefix="fkv", dir="/tmp"))  # ipc:// paths: short
    state.mkdir()
    env = {"FLEXKV_CPU_STATE_DIR": str(state), "FLEXKV_CPU_SHM_DIR": str(tmp_path / "shm"),
           "FLEXKV_SERVER_RECV_PORT": f"ipc://{sockets}/server", "FLEXKV_CPU_CACHE_GB": "1"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    boot.install_for_test(monkeypatch, SOURCE)
    prepare(monkeypatch, SOURCE)
    sglang_env.load()
    rigs: list[Rig] = []
    yield state, rigs
    for rig in rigs:
        rig.cache.flexkv_connector.connector.shutdown()  # FlexKV's processes end with it
    for leftover in sockets.iterdir():
        leftover.unlink()
    os.rmdir(sockets)


def _stored_and_evicted(rig: Rig, timeout_s: float = 60.0) -> int:
    """The scheduler's completion poll until FlexKV's store is terminal and the node can be evicted."""
    deadline = time.monotonic() + timeout_s
    while True:
        rig.cache.check_hicache_events()
        evicted = rig.evict_all()
        if evicted or time.monotonic() > deadline:
            return evicted
        time.sleep(0.05)


def _restore(rig: Rig, rid: str, old_slots, state: Path) -> tuple[list[bytes], dict[str, int], object]:
    """Restore IDS for a new request into other slots: what it reads, and the data plane's counters."""
    blocker = rig.alloc.alloc(len(IDS))  # the old slots may be handed out again: the restore goes elsewhere
    before = read(rig.pool, blocker)
    loaded, slots = rig.match_and_load(rig.request(rid, IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and slots is not None and not set(slots.tolist()) & set(old_slots.tolist())
    assert read(rig.pool, blocker) == before  # nothing else written
    return read(rig.pool, slots), read_counters(state), slots


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_store_evict_restore_through_flexkvs_real_kvmanager_is_byte_exact(flexkv, monkeypatch, models, kind):
    state, rigs = flexkv
    rig = Rig(monkeypatch, models["llama" if kind == "mha" else "deepseek"], kind)  # FlexKV starts here (~20 s)
    rigs.append(rig)
    req = rig.request("r1", IDS, prompt=40, seed=7)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    assert _stored_and_evicted(rig) == len(IDS)
    zero(rig.pool, req.slots)
    got, counters, slots = _restore(rig, "r2", req.slots, state)
    assert got == expected
    assert (counters["d2h_blocks"], counters["h2d_blocks"], counters["perturbed_blocks"]) == (3, 3, 0)
    if kind == "mla":
        return
    # negative control (same FlexKV, to start it once): its CPU copy zeroed before the next restore
    assert _stored_and_evicted(rig) == len(IDS)
    (state / "perturb").touch()
    got, counters, _ = _restore(rig, "r3", slots, state)
    assert counters["h2d_blocks"] == 6 and counters["perturbed_blocks"] == 3
    assert got != expected
