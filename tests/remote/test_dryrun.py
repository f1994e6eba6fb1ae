"""start_remote --dry-run changes nothing, and every exit has its line (real subprocesses, real files).

A dry run validates settings and paths, looks at the lock, the ports and the ready file without
taking, binding, writing or deleting, and exits with the status a real start would give now (a
missing FlexKV 5, a held lock 6, another remote's ready file 8, a health port in use 9; an
unreachable master is only a warning, as a real start waits for it), whatever state its output
streams are in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexkv_adapter.errors import FLEXKV_INSTALL_HINT
from flexkv_adapter.remote.exit_codes import MEANINGS, ExitCode

from .harness import ROOT, SCRIPT, Remote, clean_env, free_ports, holding
from .standin import MasterStandIn, register_gpus


def run(tmp: Path, *extra: str, env: dict[str, str] | None = None, shell_tail: str = "", **flags: object):
    """start_remote to completion: (status, stdout, stderr). Valid settings, nothing listening."""
    options: dict[str, object] = {
        "master-host": "127.0.0.1",
        "master-ports": ",".join(map(str, free_ports(3))),
        "nnodes": 2,
        "node-rank": 1,
        "lock-dir": str(tmp),
        "connect-timeout": 0.3,
        "transfer-manager": "tests.remote.standin:StandInRemote",
    }
    options.update({k.replace("_", "-"): v for k, v in flags.items()})
    argv = [sys.executable, str(SCRIPT), "--allow-loopback-master", *extra]
    argv += [arg for k, v in options.items() if v is not None for arg in (f"--{k}", str(v))]
    if shell_tail:  # closed or unread streams, set up by the shell
        argv = ["bash", "-c", " ".join(f"'{a}'" for a in argv) + " " + shell_tail]
    done = subprocess.run(argv, env=clean_env(**(env or {})), capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else b"" for p in sorted(path.rglob("*"))}


def test_a_dry_run_without_flexkv_prints_the_plan_with_the_hint_exits_5_and_changes_nothing(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    before = tree(tmp_path)
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "CUDA_VISIBLE_DEVICES": "1"}
    code, out, err = run(tmp_path, "--dry-run", lock_dir=None, transfer_manager=None, env=env)
    assert code == ExitCode.FLEXKV_MISSING, err
    report = json.loads(out)
    assert report["dry_run"] is True and report["transfer_manager"].startswith("flexkv.")
    assert report["exit_status"] == ExitCode.FLEXKV_MISSING
    assert any("would exit 5" in w and FLEXKV_INSTALL_HINT in w for w in report["warnings"]), report
    assert any("not reachable now" in w for w in report["warnings"]), report
    assert "would clear CUDA_VISIBLE_DEVICES='1'" in report["gpu_visibility"]
    assert " WARNING start_remote: dry run: " in err
    errors = [line for line in err.splitlines() if " ERROR start_remote: " in line]
    assert errors == [err.splitlines()[-1]] and "dry run: a real start would exit 5: " in errors[0], err
    assert tree(tmp_path) == before  # no lock file, no directory, nothing removed
    code, _, err = run(tmp_path, lock_dir=None, transfer_manager=None, env=env)  # the real start: the same status
    assert code == ExitCode.FLEXKV_MISSING, err


def test_a_dry_run_that_finds_nothing_a_real_start_would_refuse_exits_0_with_an_unreachable_master(tmp_path):
    code, out, err = run(tmp_path, "--dry-run")  # the stand-in transfer manager imports; nothing listens
    report = json.loads(out)
    assert code == ExitCode.OK and report["exit_status"] == 0, err
    assert [w for w in report["warnings"] if "not reachable now" in w] == report["warnings"] != []
    assert " ERROR " not in err


def test_a_dry_run_never_touches_a_live_remotes_ready_file_lock_or_port(tmp_path):
    first = Remote(tmp_path)
    master = MasterStandIn("127.0.0.1", first.ports, first.register_port, 1)
    try:
        first.wait_state("waiting_for_gpus")
        register_gpus(first.register_port, 1)
        first.wait_state("ready")
        written = first.ready_file.read_bytes()
        ports = ",".join(map(str, first.ports))
        standin = "tests.remote.standin:StandInRemote"
        common = {"ready_file": first.ready_file, "transfer_manager": standin, "lock_dir": tmp_path / "locks"}
        # the same master: its lock is held and its health port answers; all reported, nothing taken, and
        # the status is the first a real start meets (the lock: 6)
        same = {"master_ports": ports, "health_port": first.health_port, **common}
        code, out, err = run(tmp_path, "--dry-run", **same)
        assert code == ExitCode.ALREADY_RUNNING, err
        warnings = " | ".join(json.loads(out)["warnings"])
        assert f"would exit 6: start_remote pid {first.proc.pid}" in warnings
        assert "would exit 8" in warnings and "would exit 9" in warnings
        code, _, err = run(tmp_path, **same)
        assert code == ExitCode.ALREADY_RUNNING, err  # the real start's status is the dry run's
        # another master, the same ready file: a dry run leaves it and exits 8, as the real start does
        code, out, err = run(tmp_path, "--dry-run", **common)
        assert code == ExitCode.LOCAL_FILES and first.ready_file.read_bytes() == written, err
        code, _, err = run(tmp_path, **common)
        assert code == ExitCode.LOCAL_FILES and f"pid {first.proc.pid}" in err, err
        assert first.ready_file.read_bytes() == written and first.health()[0] == 200
        assert list((tmp_path / "locks").iterdir()) != []  # the live remote's lock file stays
        code, _, _ = first.stop()
    finally:
        master.close()
    assert code == ExitCode.OK and not first.ready_file.exists()
    assert list((tmp_path / "locks").iterdir()) == []  # removed by the remote that held it


@pytest.mark.parametrize(
    "tail", ["1>&-", "2>&-", "1>&- 2>&-", "| (exec 0<&-; sleep 0.3)"], ids=["stdout", "stderr", "both", "unread"]
)
def test_a_dry_run_with_closed_or_unread_streams_exits_0(tmp_path, tail):
    code, _, err = run(tmp_path, "--dry-run", shell_tail=tail + "; exit ${PIPESTATUS[0]}")
    assert code == ExitCode.OK, err


def test_a_class_that_is_not_a_transfer_manager_is_refused_with_2(tmp_path):
    for extra in (["--dry-run"], []):
        code, _, err = run(tmp_path, *extra, transfer_manager="json:JSONDecoder")
        assert code == ExitCode.SETTINGS and "not a remote transfer manager (no start() method)" in err, err
    code, _, err = run(tmp_path, "--dry-run", transfer_manager="not a spec")
    assert code == ExitCode.SETTINGS and "transfer_manager=" in err and "module:Class" in err, err


@pytest.mark.parametrize(
    ("dry", "flags", "status", "text"),
    [
        (False, {"master_ports": "5556,5556,5558"}, ExitCode.BAD_PORTS, "must be distinct"),
        (True, {"master_ports": "5556,5556,5558"}, ExitCode.BAD_PORTS, "must be distinct"),
        (False, {"master_lost": 3000000}, ExitCode.SETTINGS, "master_lost_s=3000000"),
        (True, {"probe_interval": 2200000}, ExitCode.SETTINGS, "probe_interval_s="),
        (True, {"grace": "1e300"}, ExitCode.SETTINGS, "grace_s="),
        (False, {"nnodes": "x"}, ExitCode.SETTINGS, "nnodes must be a positive integer, got 'x'"),
        (False, {"nnodes": "1_6"}, ExitCode.SETTINGS, "nnodes must be a positive integer, got '1_6'"),
        (False, {"no_such_flag": "1"}, ExitCode.SETTINGS, "invalid command line"),
    ],
)
def test_every_refusal_prints_the_error_line_with_its_status(tmp_path, dry, flags, status, text):
    code, _, err = run(tmp_path, *(["--dry-run"] if dry else []), **flags)
    lines = [line for line in err.splitlines() if " ERROR start_remote: " in line]
    assert code == status and len(lines) == 1 and text in lines[0], err


@pytest.mark.parametrize(("key", "dry"), [("lock_dir", True), ("ready_file", False), ("server_recv_port", True)])
def test_nul_in_a_path_setting_exits_2_with_its_line(tmp_path, key, dry):
    config = tmp_path / "remote.yaml"
    config.write_text(f'{key}: "{tmp_path}/x\\0y"\n')
    extra = ["--dry-run"] if dry else []
    code, _, err = run(tmp_path, "--config", str(config), *extra, lock_dir=None if key == "lock_dir" else tmp_path)
    assert code == ExitCode.SETTINGS and f"{key}=" in err and "NUL" in err, err


def test_help_shows_defaults_and_every_exit_status(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], env=clean_env(), capture_output=True, text=True)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "(default: 5556,5557,5558)" in text and "(default: 30.0)" in text
    assert "full table: docs/start_remote.md#exit-statuses" in text
    assert "--dry-run change nothing: print the plan (JSON), exit with a real start's status" in text
    for code in ExitCode:  # each with its meaning's first words (the full table is the docs')
        assert f"{int(code)} {MEANINGS[code][0].replace('`', '')[:12].rstrip(':')}" in text, code


def test_the_wrong_interpreter_gets_a_hint_and_status_2_not_a_traceback():
    """-I -S: no site-packages and no PYTHONPATH, as the system python without the project."""
    done = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert done.returncode == ExitCode.SETTINGS, done.stderr
    assert done.stderr.startswith("ERROR start_remote: No module named") and "Traceback" not in done.stderr
    assert sys.executable in done.stderr and ".venv/bin/python scripts/start_remote.py" in done.stderr


def test_the_docs_exit_table_is_the_code_table():
    rows = [line for line in (ROOT / "docs" / "start_remote.md").read_text().splitlines() if line.startswith("| ")]
    table = {int(r.split("|")[1]): r.split("|")[2:4] for r in rows if r.split("|")[1].strip().isdigit()}
    assert table == {int(c): [f" {m} ", f" {r} "] for c, (m, r) in MEANINGS.items()}


def test_a_real_start_that_fails_keeps_failed_visible_then_leaves_nothing(tmp_path):
    with holding() as busy:  # one master port accepts, the others do not: exit 10 after connect_timeout
        remote = Remote(tmp_path, ports=(busy, *free_ports(2)), connect_timeout=0.5)
        seen = []
        while remote.proc.poll() is None:
            seen.append(remote.health()[1].get("state"))
            time.sleep(0.02)
        code, _, err = remote.finish()
    assert code == ExitCode.MASTER_UNREACHABLE, err
    assert seen.count("failed") >= 5, seen  # served for FAILED_VISIBLE_S, polled many times
    assert list((tmp_path / "locks").iterdir()) == [] and os.listdir(remote.ipc) == []
