"""The CPU stand-ins of FlexKV's compiled parts (tests/flexkv_cpu), held to FlexKV's own behaviour.

* hashing (csrc/hash.cpp): block ``i``'s hash is XXH64 (seed 0) of every token id up to the end of
  block ``i``, because ``gen_hashes`` never resets its state between blocks;
* the whole CPU data plane: FlexKV's real KVManager, TransferManager and transfer-worker processes
  (each booted by ``tests/flexkv_cpu/site``) store pages from a registered pool and restore every byte
  into other slots, and nothing else; with the perturb flag on, the restore reads zeros.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from tests.e2e.engine_process import run_engine

from .real_flexkv import SOURCE, needs_flexkv

REPO = Path(__file__).resolve().parents[2]
pytestmark = needs_flexkv  # (xxhash, FlexKV's requirements and source: the same skip reason)


def _hashes(make_hasher) -> torch.Tensor:
    from tests.flexkv_cpu import hasher

    out = torch.zeros(3, dtype=torch.uint64)
    hasher.gen_hashes(make_hasher(), torch.arange(1000, 1048, dtype=torch.int64), 16, out)
    return out


def test_block_hashes_are_running_xxh64_prefix_digests_as_in_flexkvs_hash_cpp():
    import xxhash

    from tests.flexkv_cpu import hasher

    ids = np.arange(1000, 1048, dtype=np.int64)
    expected = [xxhash.xxh64(ids[: 16 * (i + 1)].tobytes(), seed=0).intdigest() for i in range(3)]
    assert [int(h) for h in _hashes(hasher.Hasher).numpy().view(np.uint64)] == expected
    assert hasher.get_hash_size() == 8


def test_negative_control_a_hasher_reset_per_block_loses_the_prefix():
    from tests.flexkv_cpu import hasher

    class PerBlock(hasher.Hasher):
        def update(self, data):  # broken on purpose: hashes each block alone
            self.reset()
            return super().update(data)

    right, wrong = _hashes(hasher.Hasher), _hashes(PerBlock)
    assert right[0] == wrong[0] and not torch.equal(right[1:], wrong[1:])


def _roundtrip(tmp_path: Path) -> dict:
    state = tmp_path / "state"
    state.mkdir()
    sockets = tempfile.mkdtemp(prefix="fkv", dir="/tmp")  # ipc:// paths must stay short
    path = os.pathsep.join([str(REPO), str(REPO / "tests/flexkv_cpu/site"), SOURCE])
    env = {"PYTHONPATH": path, "FLEXKV_CPU": "1", "FLEXKV_CPU_STATE_DIR": str(state),
           "FLEXKV_CPU_SHM_DIR": str(tmp_path / "shm")}  # fmt: skip
    try:
        return run_engine([sys.executable, "-m", "tests.flexkv_cpu.roundtrip", str(state), sockets],
                          deadline_s=180, env=env, cwd=str(REPO))  # fmt: skip
    finally:
        for leftover in Path(sockets).iterdir():
            leftover.unlink()
        os.rmdir(sockets)


def test_flexkvs_real_kvmanager_round_trips_every_byte_through_its_own_processes(tmp_path):
    result = _roundtrip(tmp_path)
    assert result["stored"] == "success"
    exact, perturbed = result["restores"]
    for restore in (exact, perturbed):
        assert (restore["loaded"], restore["hit"], restore["untouched"]) == ("success", 48, True)
    assert exact["exact"] and exact["counters"]["d2h_blocks"] == 3 and exact["counters"]["h2d_blocks"] == 3
    assert exact["counters"]["perturbed_blocks"] == 0
    # the negative control: FlexKV's CPU copy zeroed before the restore, and the pool reads it
    assert not perturbed["exact"] and perturbed["counters"]["perturbed_blocks"] == 3
