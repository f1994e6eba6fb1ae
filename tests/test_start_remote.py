"""scripts/start_remote.py as a real subprocess against a master that binds FlexKV's three ports.

The transfer manager is the protocol stand-in (tests/remote_standin.py); sockets, signals,
subprocesses, timers and the health endpoint are real.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from flexkv_adapter.remote.exit_codes import ExitCode

from .remote_standin import MasterStandIn, register_gpus

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "start_remote.py"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Remote:
    """One start_remote.py process with its own ports, lock dir, health endpoint and files."""

    def __init__(self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None, ports=None, **flags):
        self.tmp = tmp_path
        self.ports = ports or tuple(free_ports(3))
        self.health_port = free_ports(1)[0]
        self.register_port = f"ipc://{tmp_path}/flexkv"
        self.child_pidfile = tmp_path / "child.pid"
        self.state_file = tmp_path / "standin.jsonl"
        self.ready_file = tmp_path / "ready.json"
        options = {
            "master-host": "127.0.0.1",
            "master-ports": ",".join(map(str, self.ports)),
            "nnodes": 2,
            "node-rank": 1,
            "transfer-manager": "tests.remote_standin:StandInRemote",
            "server-recv-port": self.register_port,
            "lock-dir": str(tmp_path / "locks"),
            "health-port": self.health_port,
            "ready-file": str(self.ready_file),
            "connect-timeout": 10,
            "handshake-timeout": 10,
            "gpu-timeout": 10,
            "grace": 3,
            "probe-interval": 0.2,
            "master-lost": 0.8,
        }
        options.update({k.replace("_", "-"): v for k, v in flags.items()})
        self.argv = [sys.executable, str(SCRIPT), "--allow-loopback-master", *extra]
        self.argv += [arg for k, v in options.items() if v is not None for arg in (f"--{k}", str(v))]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXKV")}
        full_env.update(
            PYTHONPATH=str(ROOT),
            STANDIN_CHILD_PIDFILE=str(self.child_pidfile),
            STANDIN_STATE_FILE=str(self.state_file),
            **(env or {}),
        )
        self.proc = subprocess.Popen(
            self.argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/", timeout=1) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return 0, {}

    def wait_state(self, state: str, timeout: float = 15) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.finish()
            _, body = self.health()
            if body.get("state") == state:
                return body
            time.sleep(0.05)
        raise AssertionError(f"never reached {state}: {self.health()}")

    def finish(self, timeout: float = 20) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def child_alive(self) -> bool:
        pid = int(self.child_pidfile.read_text())
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def recorded(self) -> list[dict]:
        return [json.loads(line) for line in self.state_file.read_text().splitlines()]


def _serve_config(master: MasterStandIn, remote: Remote, gpus: int = 2) -> threading.Thread:
    t = threading.Thread(target=master.send_config, args=(remote.register_port, gpus), daemon=True)
    t.start()
    return t


@pytest.fixture
def master_for():
    masters = []

    def make(remote_or_ports):
        ports = remote_or_ports.ports if isinstance(remote_or_ports, Remote) else remote_or_ports
        m = MasterStandIn("127.0.0.1", ports)
        masters.append(m)
        return m

    yield make
    for m in masters:
        with contextlib.suppress(Exception):
            m.close()


def test_master_up_first_reaches_ready_serves_the_protocol_and_stops_cleanly(tmp_path, master_for):
    ports = tuple(free_ports(3))
    master = master_for(ports)
    remote = Remote(tmp_path, ports=ports, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    _serve_config(master, remote).join(10)
    remote.wait_state("waiting_for_gpus")
    assert remote.health()[0] == 503 and not remote.ready_file.exists()
    register_gpus(remote.register_port, 2)
    body = remote.wait_state("ready")
    assert remote.health()[0] == 200 and body["node_rank"] == 1
    assert json.loads(remote.ready_file.read_text())["state"] == "ready"
    assert master.is_ready() and master.submit(7) == {"op_id": 7, "completed": True}
    assert remote.child_alive()
    remote.signal(signal.SIGTERM)
    code, _, err = remote.finish()
    assert code == ExitCode.OK, err
    assert not remote.child_alive(), "the transfer manager's worker process was orphaned"
    assert not remote.ready_file.exists()
    seen = remote.recorded()
    assert seen[0] == {"cuda_visible_devices": None, "master_ports": [str(p) for p in ports]}
    assert {"registered": [[0, 0], [0, 1]]} in seen and {"shutdown": True} in seen
    assert "cleared CUDA_VISIBLE_DEVICES='0,1'" in err
    for state in ("waiting_for_master", "handshake", "waiting_for_gpus", "ready", "shutting_down"):
        assert f"state: {state}" in err


def test_master_late_is_waited_for_with_backoff(tmp_path, master_for):
    remote = Remote(tmp_path)
    time.sleep(1.2)
    assert remote.health()[1]["state"] == "waiting_for_master"
    master = master_for(remote)
    _serve_config(master, remote, gpus=1)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, 1)
    remote.wait_state("ready")
    remote.signal(signal.SIGINT)
    code, _, err = remote.finish()
    assert code == ExitCode.OK and "retry in 0.2s" in err and "Connection refused" in err


def test_master_never_up_hits_the_connect_deadline(tmp_path):
    remote = Remote(tmp_path, connect_timeout=0.8)
    code, _, err = remote.finish()
    assert code == ExitCode.MASTER_UNREACHABLE
    assert "not reachable within 0.8s" in err.splitlines()[-1]


def test_config_never_sent_hits_the_handshake_deadline(tmp_path, master_for):
    remote = Remote(tmp_path, handshake_timeout=0.8)
    master_for(remote)
    code, _, err = remote.finish()
    assert code == ExitCode.HANDSHAKE_TIMEOUT and "timed out in handshake" in err


def test_gpus_never_register_hits_the_gpu_deadline_without_orphans(tmp_path, master_for):
    remote = Remote(tmp_path, gpu_timeout=0.8)
    _serve_config(master_for(remote), remote)
    code, _, err = remote.finish()
    assert code == ExitCode.GPU_TIMEOUT and "timed out in waiting_for_gpus" in err
    assert not remote.child_alive()


def test_master_dying_after_ready_ends_the_remote(tmp_path, master_for):
    remote = Remote(tmp_path)
    master = master_for(remote)
    _serve_config(master, remote, gpus=1)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, 1)
    remote.wait_state("ready")
    master.close()
    code, _, err = remote.finish()
    assert code == ExitCode.MASTER_LOST and "unreachable for" in err
    assert not remote.child_alive()


@pytest.mark.parametrize("state", ["waiting_for_master", "handshake", "waiting_for_gpus"])
def test_sigterm_in_each_state_exits_cleanly(tmp_path, master_for, state):
    remote = Remote(tmp_path)
    if state != "waiting_for_master":
        master = master_for(remote)
        if state == "waiting_for_gpus":
            _serve_config(master, remote)
    remote.wait_state(state)
    started = time.monotonic()
    remote.signal(signal.SIGTERM)
    code, _, err = remote.finish()
    assert code == ExitCode.OK, err
    assert time.monotonic() - started < 3
    if state == "waiting_for_gpus":
        assert not remote.child_alive()


def test_shutdown_past_the_grace_period_or_a_second_signal_forces_exit(tmp_path, master_for):
    remote = Remote(tmp_path, grace=0.6, env={"STANDIN_SHUTDOWN_HANG": "1"})
    _serve_config(master_for(remote), remote, gpus=1)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, 1)
    remote.wait_state("ready")
    remote.signal(signal.SIGTERM)
    code, _, err = remote.finish()
    assert code == ExitCode.FORCED and "did not shut down within grace_s=0.6s" in err
    assert not remote.child_alive()

    (tmp_path / "second").mkdir()
    second = Remote(tmp_path / "second", grace=30, env={"STANDIN_SHUTDOWN_HANG": "1"})
    _serve_config(master_for(second), second, gpus=1)
    second.wait_state("waiting_for_gpus")
    register_gpus(second.register_port, 1)
    second.wait_state("ready")
    second.signal(signal.SIGTERM)
    second.wait_state("shutting_down")
    second.signal(signal.SIGINT)
    code, _, err = second.finish()
    assert code == ExitCode.FORCED and "another signal during shutdown" in err


def test_a_second_instance_for_the_same_master_is_refused(tmp_path):
    first = Remote(tmp_path)
    first.wait_state("waiting_for_master")
    second = Remote(tmp_path, ports=first.ports)
    code, _, err = second.finish()
    assert code == ExitCode.ALREADY_RUNNING and f"pid {first.proc.pid}" in err
    first.signal()
    assert first.finish()[0] == ExitCode.OK


def test_dry_run_validates_preflights_and_prints_the_plan(tmp_path, master_for):
    ports = tuple(free_ports(3))
    master_for(ports)
    remote = Remote(tmp_path, "--dry-run", ports=ports)
    code, out, err = remote.finish()
    assert code == ExitCode.OK, err
    plan = json.loads(out)
    assert plan["master"] == {"host": "127.0.0.1", "ports": list(ports)}
    assert plan["gpu_register_port"] == f"{remote.register_port}_gpu_register"
    assert not remote.state_file.exists()  # nothing started


def _refusal(tmp_path, *argv: str, env=None) -> tuple[int, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXKV")}
    full_env.update(env or {}, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--lock-dir", str(tmp_path), *argv],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = done.stderr.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


@pytest.mark.parametrize(
    ("argv", "env", "code", "message"),
    [
        (["--node-rank", "0", "--master-host", "10.0.0.1"], None, ExitCode.NODE_RANK_ZERO, "node 0 runs"),
        (
            ["--nnodes", "2", "--node-rank", "1", "--master-host", "127.0.0.1"],
            None,
            ExitCode.LOOPBACK_MASTER,
            "loopback",
        ),
        (
            ["--nnodes", "2", "--node-rank", "1"],
            {"FLEXKV_MASTER_HOST": "10.0.0.1", "FLEXKV_MASTER_PORTS": "5556,5556,5557"},
            ExitCode.BAD_PORTS,
            "must be distinct",
        ),
        (
            ["--nnodes", "2", "--node-rank", "1", "--master-host", "10.0.0.1", "--master-ports", "1,2,99999"],
            None,
            ExitCode.BAD_PORTS,
            "less than or equal to 65535",
        ),
        (["--nnodes", "2", "--node-rank", "5"], None, ExitCode.SETTINGS, "node_rank 5 must be < nnodes 2"),
        (
            ["--nnodes", "2", "--node-rank", "1", "--master-host", "10.0.0.1"],
            None,
            ExitCode.FLEXKV_MISSING,
            "taco-project/FlexKV",
        ),
        (["--nnodes", "2", "--node-rank", "1"], None, ExitCode.SETTINGS, "master_host is unset"),
    ],
    ids=["node-rank-0", "loopback", "duplicate-ports", "invalid-port", "bad-rank", "flexkv-missing", "no-master"],
)
def test_refusals_have_one_line_errors_and_distinct_statuses(tmp_path, argv, env, code, message):
    got, line = _refusal(tmp_path, *argv, env=env)
    assert got == code and message in line, line


def test_flexkv_adapter_start_remote_is_the_same_entry_point(tmp_path):
    exe = Path(sys.executable).with_name("flexkv-adapter")
    done = subprocess.run(
        [str(exe), "start-remote", "--node-rank", "0", "--master-host", "10.0.0.1", "--lock-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == ExitCode.NODE_RANK_ZERO
