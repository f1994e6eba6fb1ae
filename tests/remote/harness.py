"""Run scripts/start_remote.py as a real subprocess against the protocol stand-ins."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from flexkv_adapter.remote.children import descendants

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "start_remote.py"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXKV", "STANDIN", "XDG_RUNTIME"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _short_private_dir() -> Path:
    """A 0700 directory under /tmp for ipc sockets (their paths must stay short), removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="fkv", dir="/tmp"))
    atexit.register(shutil.rmtree, path, True)
    return path


class Remote:
    """One start_remote.py process with its own ports, lock dir, health endpoint and files."""

    def __init__(
        self,
        tmp: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        ports=None,
        ipc: Path | None = None,
        new_session: bool = False,
        **flags,
    ) -> None:
        self.tmp = tmp
        self.ipc = ipc or _short_private_dir()
        self.ports = ports or tuple(free_ports(3))
        self.health_port = free_ports(1)[0]
        self.server_recv_port = f"ipc://{self.ipc}/srv"
        self.register_port = f"{self.server_recv_port}_gpu_register"  # what node 0 sends, as FlexKV derives it
        self.state_file = tmp / "standin.jsonl"
        self.ready_file = tmp / "ready.json"
        (tmp / "locks").mkdir(exist_ok=True)
        options = {
            "master-host": "127.0.0.1",
            "master-ports": ",".join(map(str, self.ports)),
            "nnodes": 2,
            "node-rank": 1,
            "transfer-manager": "tests.remote.standin:StandInRemote",
            "server-recv-port": self.server_recv_port,
            "lock-dir": str(tmp / "locks"),
            "health-port": self.health_port,
            "ready-file": str(self.ready_file),
            "connect-timeout": 10,
            "handshake-timeout": 10,
            "gpu-timeout": 10,
            "engine-timeout": 20,
            "grace": 6,
            "reap-grace": 4,
            "probe-interval": 0.2,
            "master-lost": 1,
        }
        options.update({k.replace("_", "-"): v for k, v in flags.items()})
        self.argv = [sys.executable, str(SCRIPT), "--allow-loopback-master", *extra]
        self.argv += [arg for k, v in options.items() if v is not None for arg in (f"--{k}", str(v))]
        self.proc = subprocess.Popen(
            self.argv,
            env=clean_env(STANDIN_STATE_FILE=str(self.state_file), **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            start_new_session=new_session,  # its own process group, for signals to the whole group
        )
        self.children: list[int] = []

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return 0, {}

    def wait_state(self, state: str, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.finish()
            _, body = self.health()
            if body.get("state") == state:
                self.children = sorted(set(self.children) | set(descendants(self.proc.pid)))
                return body
            time.sleep(0.05)
        raise AssertionError(f"never reached {state}: {self.health()}")

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str, float]:
        """Send ``sig``; exit status, stderr and seconds to exit."""
        self.children = sorted(set(self.children) | set(descendants(self.proc.pid)))
        started = time.monotonic()
        self.proc.send_signal(sig)
        code, _, err = self.finish()
        return code, err, time.monotonic() - started

    def orphans(self) -> list[int]:
        return [pid for pid in self.children if alive(pid)]

    def recorded(self) -> list[dict]:
        if not self.state_file.exists():
            return []
        return [json.loads(line) for line in self.state_file.read_text().splitlines()]

    def states(self, err: str) -> list[str]:
        return [line.split("state: ", 1)[1].split()[0] for line in err.splitlines() if "start_remote: state: " in line]


def run_once(*argv: str, env: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, str]:
    """Run start_remote to completion; exit status and the last stderr line."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        env=clean_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = done.stderr.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


@contextlib.contextmanager
def holding(sock_kind: int = socket.SOCK_STREAM):
    """A listening TCP socket on a free port (to make a port 'in use')."""
    s = socket.socket(socket.AF_INET, sock_kind)
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()
