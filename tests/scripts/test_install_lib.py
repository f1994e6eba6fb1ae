"""scripts/_install_lib.sh: a failed install stops the script and says so; it is never 'done'.

CI once filled its disk half-way through a tier install: pip failed, each step still printed
"done", and the failure surfaced only later as a missing module.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . scripts/_install_lib.sh; {script}; echo REACHED"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("status", [1, 2, 28])
def test_a_failed_step_stops_with_its_status_and_the_free_disk(status: int) -> None:
    out = _bash(f'step "a thing" "1 MB" "now" bash -c "exit {status}"')
    assert out.returncode == status
    assert "REACHED" not in out.stdout
    assert "installing a thing FAILED (exit" in out.stderr
    assert "MB free on this disk" in out.stderr
    assert "a thing: done" not in out.stderr


def test_pip_q_returns_pips_status_not_the_filters() -> None:
    fake = ROOT / "tests" / "_fake_venv_for_install_lib"
    out = _bash(
        f'mkdir -p {fake}/bin && printf "#!/bin/sh\\necho x is ignored\\nexit 3\\n" > {fake}/bin/python'
        f" && chmod +x {fake}/bin/python && trap 'rm -rf {fake}' EXIT"
        f' && step "pkg" "1 MB" "now" pip_q {fake} pkg'
    )
    assert not fake.exists()
    assert out.returncode == 3, out
    assert "pkg FAILED (exit 3" in out.stderr


def test_a_successful_step_says_done() -> None:
    out = _bash('step "a thing" "1 MB" "now" true')
    assert out.returncode == 0 and "REACHED" in out.stdout
    assert "a thing: done in" in out.stderr


def test_too_little_disk_stops_before_installing() -> None:
    out = _bash('need_disk 999999999 "the moon tier"; step "x" "1 MB" "now" touch /nonexistent/never')
    assert out.returncode == 1
    assert "the moon tier needs about" in out.stderr and "MB is free" in out.stderr
    assert "installing x" not in out.stderr


def test_enough_disk_passes() -> None:
    assert _bash('need_disk 1 "a tiny tier"').returncode == 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_required_tier_without_its_engine_fails_instead_of_skipping(engine: str) -> None:
    """scripts/test.sh sets REQUIRE_ENGINE_TIER=1: a tier whose engine does not import is red."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is importable here; the refusal needs an environment without it")
    env = {**os.environ, "REQUIRE_ENGINE_TIER": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/{engine}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode != 0
    assert f"the {engine} tier cannot run: {engine} is not importable" in out.stdout + out.stderr
