"""scripts/_install_lib.sh: pip's output goes to a log file, named once with what its alarming lines mean; a failure
prints the log's tail and keeps pip's status; torch's CPU build is preferred, and the build installed is told.

The SGLang tier's install printed about 100 pip "dependency resolver" ERROR lines and vLLM's two "Failed to
import from vllm._C" warnings on a successful run, which read as failures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake_venv(tmp_path: Path, body: str) -> Path:
    """A venv whose python is a shell script: it records its arguments, then runs ``body``."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n{body}\n')
    python.chmod(0o755)
    return venv


def _bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . scripts/_install_lib.sh; {script}; echo REACHED"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_pips_output_goes_to_the_log_and_one_line_says_where_and_what_it_means(tmp_path):
    venv = _fake_venv(tmp_path, 'echo "ERROR: pip\'s dependency resolver ..."; echo "sglang requires x"')
    out = _bash(
        f'INSTALL_NOTE="resolver lines are expected"; pip_q {venv} a; pip_q {venv} b',
    )
    assert out.returncode == 0 and "REACHED" in out.stdout
    assert "dependency resolver" not in out.stdout + out.stderr
    told = [line for line in out.stderr.splitlines() if "pip's output goes to" in line]
    assert told == [f"setup: pip's output goes to {venv}/install.log (resolver lines are expected)"]
    log = (venv / "install.log").read_text()
    assert log.count("dependency resolver") == 2 and ": pip install a\n" in log and ": pip install b\n" in log
    assert (tmp_path / "calls").read_text().startswith("-m pip install --disable-pip-version-check")


def test_a_failed_install_prints_the_logs_tail_and_keeps_pips_status(tmp_path):
    venv = _fake_venv(tmp_path, 'echo "ERROR: No matching distribution found for nothing"; exit 7')
    out = _bash(f'step "nothing" "1 MB" "now" pip_q {venv} nothing')
    assert out.returncode == 7 and "REACHED" not in out.stdout
    assert "pip exited 7; the last lines of" in out.stderr
    assert "  | ERROR: No matching distribution found for nothing" in out.stderr
    assert "installing nothing FAILED (exit 7" in out.stderr


def test_the_import_checks_warnings_go_to_the_log_and_its_versions_to_the_console(tmp_path):
    venv = _fake_venv(tmp_path, "")
    check = 'sh -c "echo Failed to import from vllm._C >&2; echo vllm 0.33.0"'
    out = _bash(f"quiet {venv} {check}")
    assert out.stdout.startswith("vllm 0.33.0") and "vllm._C" not in out.stderr
    assert "Failed to import from vllm._C" in (venv / "install.log").read_text()
    failed = _bash(f'quiet {venv} sh -c "echo ImportError: no vllm >&2; exit 1"')
    assert failed.returncode == 1 and "  | ImportError: no vllm" in failed.stderr


def test_torch_comes_from_pips_own_sources_as_the_cpu_build_when_they_have_it(tmp_path):
    venv = _fake_venv(tmp_path, "exit 0")
    out = _bash(f"torch_cpu {venv} 2.13.0")
    assert out.returncode == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith("torch==2.13.0+cpu")


def test_without_it_there_the_wheel_comes_from_pytorchs_cpu_index_and_its_dependencies_from_pips_sources(tmp_path):
    # the first try (pip's sources) fails; the CPU index answers
    venv = _fake_venv(
        tmp_path,
        f'case "$*" in *--index-url*) exit 0;; *) [ -e {tmp_path}/tried ] && exit 0; touch {tmp_path}/tried; exit 1;; '
        "esac",
    )
    out = _bash(f"torch_cpu {venv} 2.13.0", TORCH_CPU_INDEX="https://cpu.example/whl")
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 3
    assert "--no-deps" in calls[1] and "--index-url https://cpu.example/whl" in calls[1]
    assert "--index-url" not in calls[2] and calls[2].endswith("torch==2.13.0+cpu")


def test_with_no_cpu_build_reachable_the_default_build_is_installed_and_said_so(tmp_path):
    venv = _fake_venv(tmp_path, 'case "$*" in *+cpu*) exit 1;; *) exit 0;; esac')
    out = _bash(f"torch_cpu {venv} 2.13.0", TORCH_CPU_INDEX="")
    assert out.returncode == 0
    assert "no CPU build of torch 2.13.0 in pip's sources" in out.stderr and "CUDA" in out.stderr
    assert (tmp_path / "calls").read_text().splitlines()[-1].endswith("torch==2.13.0")


def test_the_build_installed_is_read_without_importing_torch(tmp_path):
    for version, cuda, said in (("2.13.0+cpu", "None", "torch 2.13.0+cpu (CPU build)"),
                                ("2.14.1+cu130", "'13.0'", "torch 2.14.1+cu130 (CUDA 13.0 build)")):  # fmt: skip
        site = tmp_path / version / "site"
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
        (site / "torch" / "version.py").write_text(
            f"from typing import Optional\n__version__ = '{version}'\ncuda: Optional[str] = {cuda}\n"
        )
        venv = tmp_path / version / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
        (venv / "bin" / "python").chmod(0o755)
        out = _bash(f"torch_build {venv}")
        assert out.stdout.splitlines()[0] == said, out
