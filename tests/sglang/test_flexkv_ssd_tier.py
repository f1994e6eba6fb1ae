"""Adapted pools through FlexKV's SSD tier: stored, evicted from the CPU tier, restored from the SSD, byte-exact.

FlexKV's KVManager keeps a CPU tier and, below it, an SSD tier (``CacheConfig(enable_ssd=True, ...)``):
every store is written through to the SSD by FlexKV's CPU<->SSD worker, and what the CPU tier evicts
is served from the SSD file(s) again. That worker is FlexKV's compiled code (``SSDIOCTX``,
``transfer_kv_blocks_ssd``, io_uring), so it runs only where the FlexKV tree has its compiled
``flexkv/c_ext*.so`` (``scripts/install_flexkv.sh``; ``FLEXKV_SOURCE=.flexkv-build``); on a tree of
Python alone these tests skip. Only the GPU copy kernel is stood in (``tests/flexkv_cpu``).

For each pool kind (SGLang's ``MHATokenToKVPool`` and ``MLATokenToKVPool`` on CPU, and a vLLM-0.33-style
cache dict), ``tests/flexkv_cpu/ssd_roundtrip.py`` registers what ``flexkv_adapter`` plans, stores more
pages than the CPU tier holds (the first ones then live only on the SSD: a CPU-only match finds none of
them), and restores them into other blocks; every byte is compared through the engine's own accessors,
and the blocks around the restored ones must be untouched. Negative control: FlexKV's SSD file is
overwritten before the next restore, and the restored bytes are the overwrite, not the stored pages.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engine_process import run_engine
from tests.flexkv_cpu.compiled import compiled_ext

from .real_flexkv import SOURCE, needs_flexkv

REPO = Path(__file__).resolve().parents[2]
KINDS = ["mha", "mla", "vllm"]
SEQ_BLOCKS = 3  # each of A and C: 3 pages of 16 tokens
STORED_BLOCKS = 10  # A, C and B (4 pages, as many as the CPU tier holds)

pytestmark = [
    needs_flexkv,
    pytest.mark.skipif(
        bool(SOURCE) and compiled_ext([SOURCE]) is None,
        reason=f"FlexKV's SSD worker (SSDIOCTX, transfer_kv_blocks_ssd, io_uring) is compiled code and the FlexKV "
        f"tree {SOURCE} has no flexkv/c_ext*.so: build it (bash scripts/install_flexkv.sh) and run with "
        f"FLEXKV_SOURCE=.flexkv-build",
    ),
]


@pytest.fixture(scope="module")
def ssd_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One FlexKV run per pool kind (a run starts FlexKV's processes, ~15 s), shared by the tests of that kind."""
    runs: dict[str, dict[str, Any]] = {}

    def run(kind: str) -> dict[str, Any]:
        if kind not in runs:
            runs[kind] = _roundtrip(kind, tmp_path_factory.mktemp(f"ssd_{kind}"))
        return runs[kind]

    return run


def _roundtrip(kind: str, tmp: Path) -> dict[str, Any]:
    state, ssd = tmp / "state", tmp / "ssd"
    state.mkdir()
    sockets = tempfile.mkdtemp(prefix="fkv", dir="/tmp")  # ipc:// paths must stay short
    path = os.pathsep.join([str(REPO), str(REPO / "tests/flexkv_cpu/site"), SOURCE])
    # FLEXKV_SERVER_RECV_PORT (this run's socket): FlexKV also names its SSD file after it (storage_engine.py)
    env = {"PYTHONPATH": path, "FLEXKV_CPU": "1", "FLEXKV_CPU_STATE_DIR": str(state),
           "FLEXKV_CPU_SHM_DIR": str(tmp / "shm"), "FLEXKV_SERVER_RECV_PORT": f"ipc://{sockets}/server"}  # fmt: skip
    argv = [sys.executable, "-m", "tests.flexkv_cpu.ssd_roundtrip", kind, str(state), sockets, str(ssd)]
    try:
        return run_engine(argv, deadline_s=150, env=env, cwd=str(REPO))
    finally:
        for leftover in Path(sockets).iterdir():
            leftover.unlink()
        os.rmdir(sockets)


@pytest.mark.parametrize("kind", KINDS)
def test_pages_evicted_to_flexkvs_ssd_tier_are_restored_byte_exact_into_other_blocks(ssd_runs, kind):
    result = ssd_runs(kind)
    assert {name: store["status"] for name, store in result["stores"].items()} == dict.fromkeys("ACB", "success")
    restored = result["restored"]
    assert restored["cpu_hit"] == 0, "the pages are still in FlexKV's CPU tier: the restore would not read the SSD"
    assert (restored["hit"], restored["loaded"]) == (SEQ_BLOCKS * 16, "success")
    assert restored["exact"], "the restored blocks differ from the stored ones"
    assert restored["untouched"], "bytes outside the restored blocks were written"
    counters = restored["counters"]
    assert (counters["d2h_blocks"], counters["h2d_blocks"]) == (STORED_BLOCKS, SEQ_BLOCKS)
    files = result["ssd_files"]
    assert files and all(f["nonzero"] > 0 for f in files), f"FlexKV's SSD file(s) hold no data: {files}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_restore_from_a_corrupted_ssd_file_reads_the_corruption_not_the_stored_pages(ssd_runs, kind):
    """The negative control: with FlexKV's SSD file overwritten, pages only the SSD holds come back wrong."""
    corrupted = ssd_runs(kind)["corrupted"]
    assert corrupted["cpu_hit"] == 0 and (corrupted["hit"], corrupted["loaded"]) == (SEQ_BLOCKS * 16, "success")
    assert not corrupted["exact"] and corrupted["differs_everywhere"]
    assert corrupted["junk"], "the restored bytes are not the SSD file's: the restore did not read the SSD"
    assert corrupted["untouched"]
    assert corrupted["counters"]["h2d_blocks"] == 2 * SEQ_BLOCKS
