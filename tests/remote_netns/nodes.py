"""The processes of the two-node tier: FlexKV's master on node A, start_remote on node B.

Each runs under ``ip netns exec`` in its node's namespace, with its output read by a thread that
stamps every line on arrival, so a test measures from what the process said (``state:
waiting_for_master``) to what it did (its exit), and every wait ends by a deadline.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..remote.harness import ROOT, SCRIPT, clean_env
from .flexkv_cpu import source
from .netns import Between, Node
from .relay import LinkSpec, parse_stats

CPU_REMOTE = "tests.remote_netns.flexkv_remote:CPURemote"
DEFAULTS = {  # seconds: short, so the whole tier takes a few minutes
    "connect-timeout": 8,
    "handshake-timeout": 8,
    "gpu-timeout": 10,
    "engine-timeout": 10,
    "grace": 5,
    "reap-grace": 2,
    "probe-interval": 0.3,
    "master-lost": 2,
    "failed-visible": 0.2,
}


STARTUP_S = 60  # importing FlexKV (torch) took 20 s per process on a 2-core machine at load 8


def node_ports() -> tuple[int, int, int]:
    """Master ports for one test (its namespaces are new, so any free range will do; random anyway)."""
    first = random.randrange(20000, 60000)
    return first, first + 1, first + 2


class Lines:
    """Every line of ``stream``, stamped with ``time.monotonic()`` when it arrived."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.seen.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()

    def wait(self, match: Callable[[str], bool], timeout_s: float, alive: Callable[[], bool]) -> float | None:
        """When a line matching ``match`` arrived, or None by ``timeout_s`` (or once ``alive()`` is false)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for at, line in self.seen:
                    if match(line):
                        return at
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return None
                self._changed.wait(min(left, 0.1))

    def text(self) -> str:
        self._thread.join(0.5)
        return "\n".join(line for _, line in self.seen)


class Proc:
    def __init__(self, node: Node | Between, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*node.exec_prefix(), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=clean_env(FLEXKV_SOURCE=str(source()), **(env or {})),
        )
        self.started = time.monotonic()
        self.out, self.err = Lines(self.proc.stdout), Lines(self.proc.stderr)  # type: ignore[arg-type]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit(self, timeout_s: float) -> tuple[int | None, float]:
        """Exit status (None if still running after ``timeout_s``) and when it was seen."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None, time.monotonic()
        return code, time.monotonic()

    def kill(self) -> None:
        for proc in [self.proc, *getattr(self, "helpers", [])]:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Master(Proc):
    """FlexKV's ``TransferManagerMultiNodeHandle`` on node A (``tests/remote_netns/master.py``)."""

    def __init__(self, node: Node, ports: tuple[int, int, int], register_port: str, hold: bool = False) -> None:
        argv = [sys.executable, "-m", "tests.remote_netns.master", node.address, ",".join(map(str, ports))]
        super().__init__(node, [*argv, register_port, *(["hold"] if hold else [])])
        self.ports = ports

    def wait_line(self, text: str, timeout_s: float = STARTUP_S) -> float:
        at = self.out.wait(lambda line: line == text, timeout_s, self.alive)
        assert at is not None, f"master never printed {text!r}:\n{self.err.text()[-3000:]}"
        return at

    def send(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("send\n")
        self.proc.stdin.flush()

    def is_ready(self, timeout_s: float = 5) -> bool:
        """FlexKV's own ``is_ready()``: a query_ready across the link, answered by the remote."""
        assert self.proc.stdin is not None
        before = len(self.out.seen)
        self.proc.stdin.write("ready\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answers = [line for _, line in self.out.seen[before:] if line.startswith("ready ")]
            if answers:
                return answers[0] == "ready True"
            time.sleep(0.02)
        raise AssertionError("the master did not answer is_ready()")


class Relay(Proc):
    """``relay.py`` in the namespace between the nodes: each frame ``link.delay_s`` late each way, a
    seeded ``link.loss`` share dropped. Started before anything crosses the link."""

    def __init__(self, between: Between, link: LinkSpec) -> None:
        argv = [sys.executable, "-m", "tests.remote_netns.relay", between.dev_a, between.dev_b, *link.argv()]
        super().__init__(between, argv)
        at = self.out.wait(lambda line: line == "relaying", 10, self.alive)
        assert at is not None, f"the relay did not start:\n{self.err.text()[-2000:]}"

    def stop(self) -> dict[str, int]:
        """SIGTERM, then its counts (frames forwarded, dropped, failed)."""
        self.proc.send_signal(signal.SIGTERM)
        code, _ = self.exit(5)
        assert code == 0, self.err.text()[-2000:]
        return parse_stats(self.out.text().splitlines()[-1])


class StartRemote(Proc):
    """``scripts/start_remote.py`` on node B, pointed at node A's address, no --allow-loopback-master."""

    def __init__(self, node: Node, master: Node, ports: tuple[int, int, int], ipc: Path, locks: Path, **flags):
        options = {
            **DEFAULTS,
            "master-host": master.address,
            "master-ports": ",".join(map(str, ports)),
            "nnodes": 2,
            "node-rank": 1,
            "transfer-manager": CPU_REMOTE,
            "server-recv-port": f"ipc://{ipc}/srv",
            "lock-dir": str(locks),
            "ready-file": str(ipc / "ready.json"),
        }
        options.update({k.replace("_", "-"): v for k, v in flags.items()})
        argv = [sys.executable, str(SCRIPT), *(a for k, v in options.items() for a in (f"--{k}", str(v)))]
        assert "--allow-loopback-master" not in argv
        super().__init__(node, argv)
        self.node = node
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.register_port = f"ipc://{ipc}/srv_gpu_register"
        self.ready_file = ipc / "ready.json"

    def wait_state(self, state: str, timeout_s: float = STARTUP_S) -> float:
        at = self.err.wait(lambda line: f"start_remote: state: {state}" in line, timeout_s, self.alive)
        assert at is not None, f"start_remote never reached {state}:\n{self.err.text()[-3000:]}"
        return at

    def in_state(self, state: str) -> bool:
        states = [
            line.split("state: ", 1)[1].split()[0] for _, line in self.err.seen if "start_remote: state: " in line
        ]
        return bool(states) and states[-1] == state

    def register(self, ranks: int = 2) -> subprocess.Popen[bytes]:
        """Node B's GPU ranks (a process of their own on node B) register with the port the master's
        config names. Started early, they queue until the port is bound (ZMQ connects retry)."""
        argv = [sys.executable, "-m", "tests.remote_netns.flexkv_remote", self.register_port, str(ranks)]
        env = clean_env(FLEXKV_SOURCE=str(source()))
        ranks_proc = subprocess.Popen([*self.node.exec_prefix(), *argv], cwd=ROOT, env=env)
        self.helpers.append(ranks_proc)
        return ranks_proc

    def finish(self, timeout_s: float) -> tuple[int | None, float, str]:
        code, at = self.exit(timeout_s)
        return code, at, self.err.text()
