"""start_remote on a hostile host: planted links and FIFOs, stale files, bystanders, idle clients,
and every start-up failure with its own exit status and one line. Private temporary directories only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.remote.exit_codes import ExitCode
from flexkv_adapter.remote.health import CONNECTION_TIMEOUT_S, MAX_CONNECTIONS, HealthServer
from flexkv_adapter.remote.lock import (
    _machine_lock,
    default_lock_dir,
    flexkv_spawned_remotes,
    is_flexkv_spawn,
    lock_key,
)
from flexkv_adapter.remote.states import State, StateTracker

from .harness import ROOT, Remote, free_ports, holding, run_once
from .standin import MasterStandIn, register_gpus


def startup(tmp: Path, *extra: str, env: dict[str, str] | None = None, **flags: object) -> tuple[int, str]:
    """start_remote with valid settings and no master (so it would end in exit 10 quickly)."""
    options: dict[str, object] = {
        "master-host": "127.0.0.1",
        "master-ports": ",".join(map(str, free_ports(3))),
        "nnodes": 2,
        "node-rank": 1,
        "transfer-manager": "tests.remote.standin:StandInRemote",
        "lock-dir": str(tmp),
        "connect-timeout": 0.3,
    }
    options.update({k.replace("_", "-"): v for k, v in flags.items()})
    argv = [arg for k, v in options.items() if v is not None for arg in (f"--{k}", str(v))]
    return run_once("--allow-loopback-master", *extra, *argv, env=env)


def test_a_symlink_planted_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    ports = free_ports(3)
    (tmp_path / lock_key("127.0.0.1", tuple(ports))).symlink_to(victim)
    code, line = startup(tmp_path, master_ports=",".join(map(str, ports)))
    assert code == ExitCode.LOCAL_FILES and "is a symlink" in line, line
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    ports = free_ports(3)
    path = tmp_path / lock_key("127.0.0.1", tuple(ports))
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    code, line = startup(tmp_path, master_ports=",".join(map(str, ports)))
    assert code == ExitCode.LOCAL_FILES and str(path) in line, line


def _immutable(path: Path) -> bool:
    """Make ``path`` unwritable even for root (chattr +i), else by mode; False if impossible."""
    if os.geteuid() != 0:
        path.chmod(0o500)
        return True
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", ["file", "missing", "unwritable"])
def test_an_unusable_lock_dir_exits_8_with_one_line(tmp_path, kind):
    lock_dir = tmp_path / "locks"
    if kind == "file":
        lock_dir.write_text("")
    elif kind == "unwritable":
        lock_dir.mkdir()
        if not _immutable(lock_dir):
            pytest.skip("cannot make a directory unwritable here")
    try:
        code, line = startup(tmp_path, lock_dir=lock_dir)
    finally:
        if kind == "unwritable" and os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(lock_dir)], check=False)
    assert code == ExitCode.LOCAL_FILES and str(lock_dir) in line, line


@pytest.mark.parametrize("option", ["lock_dir", "ready_file"])
def test_a_lock_dir_or_ready_file_path_too_long_for_the_kernel_exits_2(tmp_path, option):
    too_long = tmp_path / ("x" * 300) / "ready.json"  # a name over NAME_MAX: refused with the settings
    code, line = startup(tmp_path, **{option: too_long if option == "ready_file" else too_long.parent})
    assert code == ExitCode.SETTINGS and "NAME_MAX" in line and "Traceback" not in line, line


def test_the_machine_wide_lock_is_taken_once_and_only_a_held_name_counts_as_taken():
    name = f"flexkv-adapter-test/{os.getpid()}/{time.monotonic_ns()}"
    first = _machine_lock(name)
    assert isinstance(first, socket.socket)
    try:
        assert _machine_lock(name) == os.getpid()  # the holder's pid, from SO_PEERCRED
    finally:
        first.close()
    assert _machine_lock("x" * 200) is None  # over the 107-byte limit: no machine lock, not "taken"


def test_the_default_lock_dir_is_private(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert default_lock_dir() == runtime
    runtime.chmod(0o777)  # open to others: not used
    assert default_lock_dir() == Path(f"/tmp/flexkv-adapter-{os.geteuid()}")
    runtime.chmod(0o700)
    code, line = startup(tmp_path, lock_dir=None, env={"XDG_RUNTIME_DIR": str(runtime)})
    assert code == ExitCode.MASTER_UNREACHABLE, line
    assert list(runtime.iterdir()) == []  # the lock file is removed by the remote that held it


def test_the_lock_key_is_the_resolved_address():
    assert lock_key("localhost", (1, 2, 3)) == lock_key("127.0.0.1", (1, 2, 3)) != lock_key("127.0.0.1", (1, 2, 4))


def test_ready_file_ignores_planted_links_and_fifos_and_a_stale_file_is_removed_at_start(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"state": "ready", "pid": 1}))  # stale, from an earlier run
    os.mkfifo(tmp_path / "ready.tmp")  # where the temporary copy used to be written
    (tmp_path / ".ready.json.tmp").symlink_to(victim)
    remote = Remote(tmp_path)
    remote.wait_state("waiting_for_master")
    assert not ready.exists(), "a stale ready file says ready while the new process waits"
    master = MasterStandIn("127.0.0.1", remote.ports, remote.register_port, 1)
    try:
        remote.wait_state("waiting_for_gpus")
        register_gpus(remote.register_port, 1)
        remote.wait_state("ready")
        assert ready.is_file() and not ready.is_symlink() and json.loads(ready.read_text())["state"] == "ready"
        assert stat.S_IMODE(ready.stat().st_mode) == 0o644
        code, err, took = remote.stop()
    finally:
        master.close()
    assert code == ExitCode.OK and took < 6, err
    assert victim.read_text() == "precious" and not ready.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".ready")) == [".ready.json.tmp"]


def test_a_missing_or_unwritable_ready_file_directory_or_a_directory_at_its_path_fails_at_start(tmp_path):
    code, line = startup(tmp_path, ready_file=tmp_path / "nowhere" / "ready.json", connect_timeout=30)
    assert code == ExitCode.LOCAL_FILES and "does not exist" in line, line
    (tmp_path / "ready.json").mkdir()
    code, line = startup(tmp_path, ready_file=tmp_path / "ready.json", connect_timeout=30)
    assert code == ExitCode.LOCAL_FILES and "is a directory" in line, line
    shut = tmp_path / "shut"
    shut.mkdir()
    if _immutable(shut):
        try:
            code, line = startup(tmp_path, ready_file=shut / "ready.json", connect_timeout=30)
        finally:
            if os.geteuid() == 0:
                subprocess.run(["chattr", "-i", str(shut)], check=False)
        assert code == ExitCode.LOCAL_FILES and "is not writable" in line, line


FLEXKV_LIKE_SPAWN = """
import pickle, time
# the shape of FlexKV's create_process script: unpickle the class, build, start, keep running
name = pickle.loads(pickle.dumps("TransferManagerOnRemote"))
class Instance:
    def start(self):
        time.sleep(60)
Instance().start()
"""


def test_only_flexkvs_own_spawn_counts_as_a_running_remote(tmp_path):
    """Only these processes are looked at: other tests' spawns on the machine may come and go. The spawn
    connects to this test's master before it starts, so no other start_remote counts it as its own."""
    bystander = subprocess.Popen(["grep", "-c", "Error in TransferManager subprocess"], stdin=subprocess.PIPE)
    lookalike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "TransferManagerOnRemote"])
    time.sleep(0.2)
    try:
        assert not {bystander.pid, lookalike.pid} & set(flexkv_spawned_remotes())
        with holding() as a, holding() as b, holding() as c:
            ports = ",".join(map(str, (a, b, c)))
            code, line = startup(tmp_path)  # a master nobody serves
            assert code == ExitCode.MASTER_UNREACHABLE, line
            socks = [socket.create_connection(("127.0.0.1", p)) for p in (a, b, c)]
            spawned = subprocess.Popen([sys.executable, "-c", FLEXKV_LIKE_SPAWN], pass_fds=[s.fileno() for s in socks])
            for sock in socks:
                sock.close()
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{spawned.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)  # an exec'ing process shows an empty command line for a moment
            try:
                assert spawned.pid in flexkv_spawned_remotes()
                code, line = startup(tmp_path, master_ports=ports)
                assert code == ExitCode.ALREADY_RUNNING and str(spawned.pid) in line, line
            finally:
                spawned.kill()
                spawned.wait()
    finally:
        for proc in (bystander, lookalike):
            proc.kill()
            proc.wait()


def test_idle_health_clients_cannot_pin_threads_and_time_out():
    tracker = StateTracker({})
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    port = server.address[1]
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        time.sleep(0.5)
        assert threading.active_count() <= before + MAX_CONNECTIONS
        time.sleep(CONNECTION_TIMEOUT_S + 0.5)
        assert threading.active_count() <= before + 1
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
        assert answer.value.code == 503 and json.loads(answer.value.read())["state"] == "waiting_for_master"
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_the_health_endpoint_listens_on_ipv6_and_a_busy_port_exits_9(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    port = free_ports(1)[0]
    remote = Remote(tmp_path, health_host="::1", health_port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://[::1]:{port}/", timeout=1)
        except urllib.error.HTTPError as e:
            assert json.loads(e.read())["state"] == "waiting_for_master"
            break
        except OSError:
            assert time.monotonic() < deadline and remote.proc.poll() is None
            time.sleep(0.05)
    assert remote.stop(signal.SIGTERM)[0] == ExitCode.OK
    with holding() as busy:
        code, line = startup(tmp_path, health_port=busy)
    assert code == ExitCode.HEALTH_ENDPOINT and f"127.0.0.1:{busy}" in line, line


def test_a_transfer_manager_import_that_raises_exits_5(tmp_path):
    (tmp_path / "broken_tm.py").write_text("raise RuntimeError('CUDA driver too old\\nsecond line')\n")
    code, line = startup(tmp_path, transfer_manager="broken_tm:Remote", env={"PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert code == ExitCode.FLEXKV_MISSING and "RuntimeError: CUDA driver too old second line" in line, line


@pytest.mark.parametrize("text", ["nnodes: [2\n", "- 1\n- 2\n", "nnodes: {a: 1}\n"], ids=["syntax", "list", "type"])
def test_a_malformed_config_file_exits_2(tmp_path, text):
    config = tmp_path / "remote.yaml"
    config.write_text(text)
    code, line = run_once("--config", str(config), "--lock-dir", str(tmp_path))
    assert code == ExitCode.SETTINGS and " ERROR start_remote: " in line and "Traceback" not in line, line


def test_sigusr2_is_logged_and_sighup_stops_cleanly_before_the_master_is_up(tmp_path):
    remote = Remote(tmp_path)
    remote.wait_state("waiting_for_master")
    remote.proc.send_signal(signal.SIGUSR2)
    time.sleep(0.2)
    assert remote.proc.poll() is None
    code, err, _ = remote.stop(signal.SIGHUP)
    assert code == ExitCode.OK and "received SIGUSR2: {'state': 'waiting_for_master'" in err, err


MARKERS = ["TransferManagerOnRemote", "Error in TransferManager subprocess", "instance.start()", "pickle.load(f)"]


@given(
    program=st.sampled_from(["grep", "/usr/bin/grep", "sh", "bash", "tail", "vim", "pgrep", "journalctl"]),
    args=st.lists(st.sampled_from(["-c", "-f", "-e", "--", *MARKERS, "x.log"]), max_size=6),
)
def test_bystanders_quoting_flexkvs_script_are_never_taken_for_a_spawned_remote(program, args):
    assert not is_flexkv_spawn([program, *args])
    assert not is_flexkv_spawn([sys.executable, *args[:1], "import time; time.sleep(1)", *args])


@given(st.text(alphabet="abcdef/_.0123456789", min_size=1, max_size=30))
def test_flexkvs_own_spawn_script_is_recognised_wherever_its_files_are(path):
    script = "\n".join(
        [
            "import pickle",
            f'with open("{path}.cls", "rb") as f:',
            "    cls = pickle.load(f)",
            'print("Creating TransferManagerOnRemote instance...")',
            "instance = cls()",
            "instance.start()",
        ]
    )
    assert is_flexkv_spawn(["/usr/bin/python3.10", "-c", script])


@given(st.lists(st.sampled_from(list(State)), max_size=12))
def test_states_only_ever_move_forward(moves):
    tracker = StateTracker({})
    seen = [tracker.state]
    for state in moves:
        if tracker.set(state):
            seen.append(state)
        assert tracker.state is seen[-1]
    order = list(State)
    assert [order.index(s) for s in seen] == sorted({order.index(s) for s in seen})


def test_a_master_name_that_resolves_to_the_wildcard_address_is_refused(monkeypatch):
    # e.g. a blocklisting /etc/hosts maps the name to 0.0.0.0; literal wildcards already fail at load
    from flexkv_adapter.config.settings import load_settings
    from flexkv_adapter.remote import preflight
    from flexkv_adapter.remote.exit_codes import RemoteExit

    real = socket.getaddrinfo

    def wildcard(host, port, *args, **kwargs):  # numeric lookups as the real resolver
        if host != "node0.example":
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("0.0.0.0", port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", wildcard)
    settings = load_settings(nnodes=2, node_rank=1, master_host="node0.example")
    with pytest.raises(RemoteExit) as raised:
        preflight.validate(settings)
    assert raised.value.code == ExitCode.SETTINGS and "wildcard" in str(raised.value)
