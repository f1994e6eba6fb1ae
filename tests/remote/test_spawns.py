"""FlexKV-spawned remotes are told apart by the master their sockets connect to (real processes,
real TCP connections, read from /proc); their pickle files are never opened."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexkv_adapter.remote.exit_codes import ExitCode
from flexkv_adapter.remote.spawns import classify_spawns, spawn_of

from .harness import free_ports, holding
from .test_dryrun import run

# The shape of FlexKV's create_process script (build from the pickled class, start, keep running),
# here connecting to the master ports given in argv like TransferManagerOnRemote's three sockets.
# Its "kwargs file" is a trap: opening it would be noticed.
SPAWN = """
import pickle, socket, sys, time
# with open(kwargs_file, "rb") as f: kwargs = pickle.load(f)  (FlexKV's; never done here)
name = "TransferManagerOnRemote"
class Instance:
    def start(self):
        self.socks = [socket.create_connection(("127.0.0.1", int(p))) for p in sys.argv[1:]]
        print("connected", flush=True)
        time.sleep(60)
Instance().start()
"""


class Spawned:
    def __init__(self, *ports: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SPAWN, *map(str, ports)], stdout=subprocess.PIPE, text=True)
        if ports:
            assert self.proc.stdout is not None and self.proc.stdout.readline() == "connected\n"
        else:
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{self.proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def listening():
    with holding() as a, holding() as b, holding() as c:
        yield (a, b, c)


def test_a_spawn_is_told_by_the_master_ports_it_connects_to(listening):
    spawn = Spawned(*listening)
    try:
        seen = spawn_of(spawn.proc.pid)
        assert seen.peers is not None and {("127.0.0.1", p) for p in listening} <= seen.peers
        refused, others = classify_spawns("127.0.0.1", listening)
        assert [s.pid for s in refused] == [spawn.proc.pid] and others == []
        refused, others = classify_spawns("localhost", listening)  # however the host is spelled
        assert [s.pid for s in refused] == [spawn.proc.pid]
        other_master = tuple(free_ports(3))
        refused, others = classify_spawns("127.0.0.1", other_master)
        assert refused == [] and [s.pid for s in others] == [spawn.proc.pid]
    finally:
        spawn.close()


def test_start_remote_refuses_a_spawn_for_its_master_and_warns_for_another(tmp_path, listening):
    spawn = Spawned(*listening)
    try:
        code, _, err = run(tmp_path, master_ports=",".join(map(str, listening)))
        assert code == ExitCode.ALREADY_RUNNING and f"pid {spawn.proc.pid} (connected to 127.0.0.1:" in err, err
        code, _, err = run(tmp_path)  # another master: warned, then it goes on (and finds no master: 10)
        assert code == ExitCode.MASTER_UNREACHABLE, err
        assert "spawned a remote for another master" in err and str(spawn.proc.pid) in err
        code, out, err = run(tmp_path, "--dry-run", master_ports=",".join(map(str, listening)))
        assert code == ExitCode.OK and f"would exit 6: FlexKV's engine spawned a remote, pid {spawn.proc.pid}" in out
    finally:
        spawn.close()


def test_a_spawn_whose_master_cannot_be_told_is_refused(tmp_path):
    spawn = Spawned()  # no connection yet
    try:
        code, _, err = run(tmp_path)
        assert code == ExitCode.ALREADY_RUNNING and f"pid {spawn.proc.pid} (no TCP connection yet)" in err, err
    finally:
        spawn.close()
