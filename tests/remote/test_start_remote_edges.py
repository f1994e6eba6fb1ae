"""start_remote and ``remote: external`` at their edges (real sockets, processes, /proc): std streams
closed at start (fds 0-2 must not be handed to the lock file or a socket), a lock whose machine-wide
socket is probed more often than its backlog holds, a spawn that exits while its sockets are read, a
wait that sleeps past ``remote_absent_s``, and path settings with newlines, empty or relative values.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.config import pids
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.integrations.sglang.external_remote import ExternalRemoteError, wait_for_start_remote
from flexkv_adapter.remote import spawns, states, teardown
from flexkv_adapter.remote.exit_codes import ExitCode, RemoteExit
from flexkv_adapter.remote.lock import InstanceLock

from ..integrations.sglang.test_external_remote_probe_bounds import _http, serving
from .harness import ROOT, SCRIPT, clean_env, free_ports, holding
from .test_dryrun import run
from .test_spawns import Spawned

PORTS = ("5556", "5557", "5558")


def _close_std_fds() -> None:
    for fd in (0, 1, 2):
        os.close(fd)


def test_closed_std_fds_are_not_handed_to_the_lock_file_or_a_socket(tmp_path):
    """With fds 0-2 closed at start, whatever start_remote opens next (the lock file, the health
    socket) would become "stderr": a C library's or a forked worker's message would land in it."""
    health = free_ports(1)[0]
    argv = [sys.executable, str(SCRIPT), "--allow-loopback-master", "--master-host", "127.0.0.1"]
    argv += ["--master-ports", ",".join(map(str, free_ports(3))), "--nnodes", "2", "--node-rank", "1"]
    argv += ["--lock-dir", str(tmp_path), "--connect-timeout", "20", "--health-port", str(health)]
    argv += ["--transfer-manager", "tests.remote.standin:StandInRemote"]
    proc = subprocess.Popen(argv, env=clean_env(), cwd=ROOT, preexec_fn=_close_std_fds)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the health endpoint answers once the lock is taken
            try:
                socket.create_connection(("127.0.0.1", health), 0.5).close()
                break
            except OSError:
                assert proc.poll() is None
                time.sleep(0.05)
        targets = {fd: os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in (0, 1, 2)}
        assert set(targets.values()) == {os.devnull}, targets
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == ExitCode.OK
        assert list(tmp_path.iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_holder_is_named_however_often_it_is_asked(tmp_path):
    """The machine-wide socket listens with a backlog of one: unaccepted probes filled it, and from
    the third dry run on a held lock looked free (and a contender said 'pid unknown')."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ports = tuple(free_ports(3))
    held = InstanceLock(tmp_path / "a", "127.0.0.1", ports)
    held.acquire()
    try:
        other = InstanceLock(tmp_path / "b", "127.0.0.1", ports)
        assert [other.holder() for _ in range(6)] == [str(os.getpid())] * 6
        for _ in range(3):
            with pytest.raises(RemoteExit) as exc:
                InstanceLock(tmp_path / "b", "127.0.0.1", ports).acquire()
            assert exc.value.code is ExitCode.ALREADY_RUNNING and f"pid {os.getpid()})" in str(exc.value)
        code, out, _ = run(tmp_path / "b", "--dry-run", master_ports=",".join(map(str, ports)))
        assert code == ExitCode.ALREADY_RUNNING  # a held lock: the dry run exits as the real start would
        assert f"pid {os.getpid()} holds the lock" in json.loads(out)["warnings"][0]
    finally:
        held.release()
    assert InstanceLock(tmp_path / "b", "127.0.0.1", ports).holder() is None


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_spawn_that_exits_while_its_sockets_are_read_is_not_refused(monkeypatch, reaped):
    """/proc race: listed as a spawn, gone (or a zombie) when its fds are read. It serves no master:
    refusing it as 'sockets not readable' would make start_remote exit 6 for nothing."""
    with holding() as port:  # a master of its own, listening while the spawn lives
        spawn = Spawned(port)  # connected from its start: no other test's start_remote refuses it
        real = spawns.flexkv_spawned_remotes

        def listed_then_gone() -> list[int]:
            found = real()
            assert spawn.proc.pid in found
            spawn.proc.kill()
            if reaped:
                spawn.proc.wait()
            else:  # killed, not yet collected: a zombie with an empty cmdline and no fds
                while Path(f"/proc/{spawn.proc.pid}/cmdline").read_bytes():
                    time.sleep(0.01)
            return found

        monkeypatch.setattr(spawns, "flexkv_spawned_remotes", listed_then_gone)
        try:
            refused, others = spawns.classify_spawns("127.0.0.1", tuple(free_ports(3)))
            assert spawn.proc.pid not in [s.pid for s in refused + others], refused
        finally:
            spawn.close()


def test_the_wait_never_sleeps_past_remote_absent_s():
    """Nothing listens: the engine must give up at remote_absent_s, not at the next 0.5 s poll."""
    sleeps: list[float] = []
    settings = load_settings(health_port=free_ports(1)[0], remote_wait_s=30, remote_absent_s=0.05)
    with pytest.raises(ExternalRemoteError, match="remote_absent_s=0.05"):
        wait_for_start_remote(settings, "127.0.0.1", PORTS, sleep=lambda s: (sleeps.append(s), time.sleep(s)))
    assert sleeps and max(sleeps) <= 0.05, sleeps


@pytest.mark.parametrize("poll_s", [0.05, 5.0])
def test_a_port_that_answered_then_accepts_and_never_answers_is_given_up_at_remote_absent_s(poll_s):
    """A stopped start_remote (SIGSTOP, a wedged health thread) still accepts. The probe cut short
    by the deadline kept the earlier answer as the latest, which restarted remote_absent_s on
    every poll: the engine waited all of remote_wait_s (600 s by default) and blamed node 0."""
    answers, hang = iter([True]), threading.Event()

    def once_then_silent(conn) -> None:
        conn.recv(1024)
        if next(answers, False):
            conn.sendall(_http(json.dumps({"state": "handshake"}).encode()))
        else:
            hang.wait(10)

    sleeps: list[float] = []
    started = time.monotonic()
    try:
        with serving(once_then_silent) as port:
            settings = load_settings(health_port=port, remote_wait_s=30, remote_absent_s=0.4)
            with pytest.raises(ExternalRemoteError, match="went away .*silent for remote_absent_s=0.4"):
                wait_for_start_remote(
                    settings, "127.0.0.1", PORTS, sleep=lambda s: (sleeps.append(s), time.sleep(s)), poll_s=poll_s
                )
    finally:
        hang.set()
    assert time.monotonic() - started < 10  # not remote_wait_s
    assert sleeps and max(sleeps) <= 0.4 + 1e-6, sleeps


@pytest.mark.parametrize(
    "answer", [{"state": "failed", "detail": "x" * 60000}, {"state": "y" * 60000}], ids=["detail", "state"]
)
def test_a_huge_detail_or_state_from_the_health_port_is_clipped_in_the_error(answer):
    body = json.dumps(answer).encode()
    with serving(lambda c: (c.recv(1024), c.sendall(_http(body)))) as port, pytest.raises(ExternalRemoteError) as exc:
        wait_for_start_remote(load_settings(health_port=port, remote_wait_s=0.3), "127.0.0.1", PORTS)
    assert "start_remote" in str(exc.value) and len(str(exc.value)) < 2000


BAD_PATHS = [
    ("lock_dir", "/tmp/a\nb", "control character"),
    ("ready_file", "/tmp/r\r.json", "control character"),
    ("server_recv_port", "ipc:///tmp/a\nb", "control character"),
    ("health_host", "127.0.0.1\n", "control character"),
    ("master_host", "node0\t", "control character"),
    ("lock_dir", "", "empty"),
    ("ready_file", "", "empty"),
    ("ready_file", "ready.json", "absolute"),
    ("lock_dir", "locks", "absolute"),
    ("ready_file", "/" + "a" * 5000, "4095 bytes"),
    ("lock_dir", "/tmp/" + "b" * 300, "255 bytes"),
    ("ready_file", "/tmp/\ud800", "cannot encode"),
    ("master_host", "node\udfff", "cannot encode"),
]


@pytest.mark.parametrize(("key", "value", "why"), BAD_PATHS)
def test_path_settings_are_refused_at_load(key, value, why):
    with pytest.raises(SettingsError, match=why) as exc:
        load_settings(**{key: value})
    assert "\n" not in str(exc.value).split("\n  ", 1)[1]  # one line per problem, the value as repr


def test_a_newline_in_a_path_exits_2_with_one_error_line(tmp_path):
    code, _, err = run(tmp_path, lock_dir="/tmp/no\nsuch")
    assert code == ExitCode.SETTINGS, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "ERROR start_remote:" in lines[0] and "control character" in lines[0], err


def test_an_unencodable_path_in_the_config_file_exits_2_not_1(tmp_path):
    """YAML's "\\ud800" reached os.lstat as a lone surrogate: UnicodeEncodeError, a traceback, exit 1."""
    config = tmp_path / "c.yaml"
    config.write_text('ready_file: "/tmp/\\ud800x"\n')
    code, _, err = run(tmp_path, config=str(config))
    assert code == ExitCode.SETTINGS and "ready_file=" in err and "cannot encode" in err, err


def test_a_dry_run_writes_no_bytecode_for_the_transfer_manager_it_imports(tmp_path):
    """Importing a transfer manager from a writable tree (FlexKV installed editable) wrote its
    __pycache__: a dry run changed files."""
    pkg = tmp_path / "src"
    pkg.mkdir()
    (pkg / "my_manager.py").write_text(
        "class Remote:\n    def __init__(self, master_host, master_ports):\n        pass\n\n    def start(self):\n"
        "        pass\n"
    )
    before = sorted(p.name for p in pkg.rglob("*"))
    env = {"PYTHONPATH": f"{ROOT}:{pkg}"}
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a plain machine
    try:
        code, out, err = run(tmp_path, "--dry-run", transfer_manager="my_manager:Remote", env=env)
    finally:
        if saved is not None:
            os.environ["PYTHONDONTWRITEBYTECODE"] = saved
    assert code == 0 and json.loads(out)["transfer_manager"] == "my_manager:Remote", err
    assert sorted(p.name for p in pkg.rglob("*")) == before


BIND_AGAIN = """
import os, socket, sys, time
os.unlink(sys.argv[1])  # as libzmq's ipc bind does with a path in use
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
print("bound", flush=True)
time.sleep(30)
"""


def test_shutdown_removes_only_ipc_socket_files_this_process_still_holds(tmp_path):
    """Another instance bound the same register path after this one (libzmq unlinks and binds
    again): removing 'our' socket file on the way out cut that instance off."""
    path = str(tmp_path / "srv_gpu_register")
    ours = socket.socket(socket.AF_UNIX)
    ours.bind(path)
    ours.listen()
    other = subprocess.Popen([sys.executable, "-c", BIND_AGAIN, path], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "bound\n"
        teardown._unlink_ipc(f"ipc://{path}")
        assert os.path.exists(path)  # the other instance's socket file stays
    finally:
        other.kill()
        other.wait()
    os.unlink(path)
    mine = socket.socket(socket.AF_UNIX)
    mine.bind(path)
    mine.listen()
    teardown._unlink_ipc(f"ipc://{path}")
    assert not os.path.exists(path)  # a file only this process holds is removed
    for sock in (ours, mine):
        sock.close()


def test_a_ready_file_whose_process_exits_while_checked_is_stale_not_another_remotes(tmp_path, monkeypatch):
    """/proc race: its pid answered os.kill, then exited before its command line was read. An
    unreadable command line counted as 'a running remote': exit 8 for a file nobody owns."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "start_remote"])
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"state": "ready", "pid": proc.pid}))
    real_kill = os.kill

    def checked_then_gone(pid: int, sig: int) -> None:
        real_kill(pid, sig)
        if pid == proc.pid and sig == 0:
            proc.kill()
            proc.wait()

    monkeypatch.setattr(os, "kill", checked_then_gone)
    try:
        assert not pids.alive(proc.pid)  # the engine's look at the same file
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "start_remote"])
        ready.write_text(json.dumps({"state": "ready", "pid": proc.pid}))
        assert states.ReadyFile(ready).in_use_by() is None
        states.ReadyFile(ready).claim()  # stale: removed, not refused
        assert not ready.exists()
    finally:
        monkeypatch.undo()
        proc.kill()
        proc.wait()
