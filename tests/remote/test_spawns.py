"""FlexKV-spawned remotes are told apart by the master their sockets connect to (real processes,
real TCP connections, read from /proc); their pickle files are never opened."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.remote import spawns
from flexkv_adapter.remote.cli import _refuse_spawns
from flexkv_adapter.remote.exit_codes import ExitCode, RemoteExit
from flexkv_adapter.remote.spawns import Spawn, _verdict, classify_spawns, spawn_of

from .harness import free_ports, holding
from .test_dryrun import run

# The shape of FlexKV's create_process script (build from the pickled class, start, keep running).
# Its "kwargs file" is a trap: opening it would be noticed. The test connects the spawn's sockets to
# its master's ports before it starts (inherited), so from its first moment as a FlexKV-like process
# its sockets tell its master: start_remotes of other tests on this machine see a spawn for another
# master (a warning), never one whose master cannot be told (which each of them would refuse).
SPAWN = """
import pickle, time
# with open(kwargs_file, "rb") as f: kwargs = pickle.load(f)  (FlexKV's; never done here)
name = "TransferManagerOnRemote"
class Instance:
    def start(self):
        time.sleep(60)  # holding the connections it was started with
Instance().start()
"""


class Spawned:
    """A FlexKV-like spawn connected to ``ports`` on 127.0.0.1 (real TCP connections)."""

    def __init__(self, *ports: int) -> None:
        assert ports, "a spawn with no connection is refused by every start_remote on the machine"
        socks = [socket.create_connection(("127.0.0.1", p)) for p in ports]
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", SPAWN], pass_fds=[s.fileno() for s in socks])
        finally:
            for sock in socks:
                sock.close()
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{self.proc.pid}/cmdline").read_bytes().count(b"TransferManagerOnRemote"):
            assert time.monotonic() < deadline and self.proc.poll() is None, "the spawn never started"
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def listening():
    with holding() as a, holding() as b, holding() as c:
        yield (a, b, c)


def _pids(spawns: list[Spawn]) -> list[int]:
    return [s.pid for s in spawns]


def test_a_spawn_is_told_by_the_master_ports_it_connects_to(listening):
    """Only this test's spawn is looked at: other spawns on the machine may come and go."""
    spawn = Spawned(*listening)
    try:
        seen = spawn_of(spawn.pid)
        assert seen.peers is not None and {("127.0.0.1", p) for p in listening} <= seen.peers
        refused, others = classify_spawns("127.0.0.1", listening)
        assert spawn.pid in _pids(refused) and spawn.pid not in _pids(others)
        mine = next(s for s in refused if s.pid == spawn.pid)
        assert "FlexKV's create_process script" in mine.describe()
        assert "connected to this master's 127.0.0.1:" in mine.describe() and str(listening[0]) in mine.describe()
        refused, others = classify_spawns("localhost", listening)  # however the host is spelled
        assert spawn.pid in _pids(refused)
        other_master = tuple(free_ports(3))
        refused, others = classify_spawns("127.0.0.1", other_master)
        assert spawn.pid not in _pids(refused) and spawn.pid in _pids(others)
        assert "not to this master" in next(s for s in others if s.pid == spawn.pid).describe()
    finally:
        spawn.close()


def test_start_remote_refuses_a_spawn_for_its_master_and_warns_for_another(tmp_path, listening):
    spawn = Spawned(*listening)
    try:
        code, _, err = run(tmp_path, master_ports=",".join(map(str, listening)))
        assert code == ExitCode.ALREADY_RUNNING and f"pid {spawn.pid}: " in err, err
        assert "connected to this master's 127.0.0.1:" in err.splitlines()[-1], err
        code, _, err = run(tmp_path)  # another master: warned, then it goes on (and finds no master: 10)
        assert code == ExitCode.MASTER_UNREACHABLE, err
        assert "spawned a remote for another master" in err and str(spawn.pid) in err
        code, out, err = run(tmp_path, "--dry-run", master_ports=",".join(map(str, listening)))
        assert code == ExitCode.ALREADY_RUNNING, err  # the dry run's status is the real start's
        assert f"would exit 6: FlexKV's engine spawned a remote, pid {spawn.pid}:" in out
    finally:
        spawn.close()


@pytest.fixture
def unconnected(monkeypatch):
    """A real process with no TCP connection, counted as a FlexKV spawn by this test's checks only
    (its own command line is not FlexKV-like, so no other start_remote on the machine counts it)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    real = spawns.flexkv_spawned_remotes
    monkeypatch.setattr(spawns, "flexkv_spawned_remotes", lambda: [*real(), proc.pid])
    monkeypatch.setattr(spawns, "is_flexkv_spawn", lambda argv: True)  # the second look, after its sockets
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_spawn_whose_master_cannot_be_told_is_refused_naming_it_and_why(unconnected):
    settings = load_settings(nnodes=2, node_rank=1, master_host="127.0.0.1", master_ports=tuple(free_ports(3)))
    refused, _ = classify_spawns("127.0.0.1", settings.master_ports)
    assert unconnected in _pids(refused)
    with pytest.raises(RemoteExit) as raised:
        _refuse_spawns(settings)
    assert raised.value.code == ExitCode.ALREADY_RUNNING
    why = f"pid {unconnected}: {sys.executable} -c running FlexKV's create_process script"
    assert why in str(raised.value) and "no TCP connection yet, so its master cannot be told" in str(raised.value)


def test_a_spawn_whose_sockets_are_not_readable_is_refused():
    """Another user's spawn: /proc/<pid>/fd is closed to us, so its master cannot be told."""
    spawn = Spawn(1, None)
    refused, why = _verdict(spawn, {"127.0.0.1"}, (1, 2, 3))
    assert refused and "not readable" in why
    refused, why = _verdict(Spawn(1, frozenset({("127.0.0.1", 9)})), {"127.0.0.1"}, (1, 2, 3))
    assert not refused and "not to this master" in why
