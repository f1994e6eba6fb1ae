"""SGLang 0.5.23 generates through the plugin and FlexKV's real Python: restored tokens equal the cold run.

One CPU engine (``tests/e2e/sglang_engine.py``, in ``.venv-sglang``, its own process group under a
deadline) runs every scenario; each test below checks one of them. FlexKV's own data plane counts the
blocks it restored (``tests/flexkv_cpu/counters.py``): the restores must come from FlexKV, not from
SGLang's radix cache. Skipped, with the reason, without the SGLang engine environment
(``bash scripts/install_sglang_engine_cpu.sh``) or without FlexKV's source (``tests/flexkv_source.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engine_process import run_engine
from tests.flexkv_cpu.compiled import compiled_ext
from tests.flexkv_source import find

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-sglang" / "bin" / "python"
STANDINS = REPO / "tests" / "e2e" / "sglang_standins"
SITE = REPO / "tests" / "flexkv_cpu" / "site"
NEEDS = [
    "sglang",
    "uvloop",
    "xgrammar",
    "fastapi",
    "openai",
    "einops",
    "transformers",
    "xxhash",
    "nvtx",
    "expiring_dict",
]
# (the last three are FlexKV's own requirements: xxhash for the hashing stand-in)
PROBE = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
# FlexKV built with its compiled extension for SGLang's torch (scripts/install_flexkv.sh; scripts/test.sh sets it)
SGLANG_SIDE_FLEXKV = os.environ.get("FLEXKV_SGLANG_SOURCE", "")
DEADLINE_S = 420  # a hang guard: the run takes 2-3 minutes on a busy 2-core machine
INSTALL = "bash scripts/install_sglang_engine_cpu.sh"


def _missing() -> str:
    if not PYTHON.is_file():
        return f"no SGLang environment ({PYTHON}); run {INSTALL}"
    probe = subprocess.run([str(PYTHON), "-c", PROBE, *NEEDS], capture_output=True, text=True, timeout=120)
    if probe.returncode or probe.stdout.strip():
        return f"SGLang's CPU engine lacks {probe.stdout.strip() or probe.stderr.strip()[-300:]}; run {INSTALL}"
    return find().skip_reason


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = _missing()
    if reason:
        if os.environ.get("REQUIRE_ENGINE_TIER") == "1":
            pytest.fail(f"the SGLang end-to-end tier cannot run: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("sglang_e2e")
    model, state = root / "model", root / "state"
    state.mkdir()
    subprocess.run([str(PYTHON), "-m", "tests.e2e.tiny_model", str(model)], cwd=REPO, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    sockets = tempfile.mkdtemp(prefix="fkv", dir="/tmp")  # ipc:// paths must stay short
    env = {
        "PYTHONPATH": os.pathsep.join([str(REPO), str(SITE), SGLANG_SIDE_FLEXKV or str(find().root), str(STANDINS)]),
        "FLEXKV_CPU": "1", "FLEXKV_CPU_STATE_DIR": str(state), "FLEXKV_CPU_SHM_DIR": str(root / "shm"),
        "FLEXKV_ENABLE_MPS": "0", "FLEXKV_CPU_CACHE_GB": "1",
        "FLEXKV_SERVER_RECV_PORT": f"ipc://{sockets}/server", "SGLANG_PLUGINS": "flexkv_adapter",
    }  # fmt: skip
    try:
        return run_engine([str(PYTHON), "-m", "tests.e2e.sglang_engine", str(model), str(state)],
                          deadline_s=DEADLINE_S, env=env, cwd=str(REPO))  # fmt: skip
    finally:
        for leftover in Path(sockets).iterdir():
            leftover.unlink()
        os.rmdir(sockets)


def _step(run: dict[str, Any], name: str) -> dict[str, Any]:
    step: dict[str, Any] = run["steps"][name]
    return step


def test_prompts_are_prefilled_in_chunks(run):
    """SGLang's default chunked prefill, at a size every prompt exceeds: its PrefillAdder cuts each prompt into
    chunks of ``chunked_prefill_size`` tokens (managers/schedule_policy.py:932-942), so the restores below are
    of prompts SGLang prefilled chunk by chunk."""
    assert 0 < run["chunked_prefill_size"] < run["prompt"]


def test_flexkv_runs_its_compiled_extension_and_index_where_built(run):
    """With the build (scripts/test.sh), nothing stands in for c_ext but the GPU-only names, and FlexKV's
    default index (the compiled one) serves; without it, the stand-ins and FlexKV's Python index."""
    if compiled_ext([SGLANG_SIDE_FLEXKV or str(find().root)]) is not None:
        assert re.fullmatch("[0-9a-f]{12}", run["c_ext"]) and run["index_accel"] == "FlexKV's default", run["c_ext"]
    else:
        assert run["c_ext"] == "cpu-stand-in" and run["index_accel"] == "0"


def test_cold_run_is_served_by_nothing(run):
    cold = _step(run, "cold")
    assert cold["restored_blocks"] == 0 and not cold["cached_tokens"]
    assert run["stored_after_cold"] > 0  # FlexKV copied A's pages to its CPU cache


def test_prompt_evicted_from_sglang_is_restored_by_flexkv_with_the_cold_tokens(run):
    cold, again = _step(run, "cold"), _step(run, "restored")
    assert again["restored_blocks"] > 0, again  # FlexKV's data plane copied A back, SGLang did not keep it
    assert again["cached_tokens_details"]["host"] > 0 and again["cached_tokens_details"]["device"] == 0
    assert again["tokens"] == cold["tokens"]


def test_a_shared_prefix_alone_is_restored_and_the_tokens_equal_a_cold_run(run):
    reference, partial = _step(run, "partial_reference"), _step(run, "partial")
    assert reference["restored_blocks"] == 0 and not reference["cached_tokens"]  # salted: past FlexKV and radix
    assert 0 < partial["restored_blocks"] <= run["shared_pages"] < _step(run, "restored")["restored_blocks"]
    assert partial["tokens"] == reference["tokens"]


def test_other_prompts_restored_by_flexkv_keep_their_tokens(run):
    for i in range(3):
        first, second = _step(run, f"p1_filler{i}"), _step(run, f"p2_filler{i}")
        assert second["restored_blocks"] > 0 and second["tokens"] == first["tokens"], i


def test_negative_control_a_perturbed_flexkv_cpu_copy_changes_the_tokens(run):
    cold, perturbed = _step(run, "cold"), _step(run, "perturbed")
    assert perturbed["perturbed_blocks"] > 0 and perturbed["restored_blocks"] > 0
    assert perturbed["tokens"] != cold["tokens"]


def test_a_flush_empties_flexkv_too_and_the_next_run_is_cold(run):
    assert run["steps"]["flush"]["success"], run["steps"]["flush"]  # SGLang's flush, FlexKV's reset with it
    cold, after = _step(run, "cold"), _step(run, "after_flush")
    assert after["restored_blocks"] == 0 and not after["cached_tokens"], after  # neither SGLang nor FlexKV
    assert after["tokens"] == cold["tokens"]
