"""scripts/start_remote.py as a real subprocess against stand-ins that behave like FlexKV's remote.

The stand-in (tests/remote/standin.py) blocks in its constructor for the one config, blocks in
start(), spawns worker processes that take time to exit, and hangs for ever in shutdown() after
ready; the master sends its config once. Sockets, signals, processes and timers are real.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time

import pytest

from flexkv_adapter.remote.exit_codes import ExitCode

from .harness import Remote, run_once
from .standin import MasterStandIn, register_gpus

ORDER = ["waiting_for_master", "handshake", "waiting_for_gpus", "starting_engine", "ready", "shutting_down", "failed"]


@pytest.fixture
def master_for():
    masters = []

    def make(remote: Remote, gpus: int = 2, register_port: str | None = None, config: dict | None = None):
        m = MasterStandIn("127.0.0.1", remote.ports, register_port or remote.register_port, gpus, config)
        masters.append(m)
        return m

    yield make
    for m in masters:
        with contextlib.suppress(Exception):
            m.close()


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if " ERROR start_remote: " in line]
    assert len(lines) == 1, err
    return lines[0]


def assert_forward(states: list[str]) -> None:
    assert [ORDER.index(s) for s in states] == sorted(ORDER.index(s) for s in states), states
    assert len(set(states)) == len(states), states


def to_ready(remote: Remote, master_for, gpus: int = 2) -> MasterStandIn:
    master = master_for(remote, gpus)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, gpus)
    remote.wait_state("ready")
    return master


def test_ready_serves_the_protocol_and_sigterm_exits_0_despite_the_hanging_shutdown(tmp_path, master_for):
    remote = Remote(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1", "STANDIN_ALLOC_S": "1"})
    master = master_for(remote)
    body = remote.wait_state("waiting_for_gpus")
    assert remote.register_port in body["detail"] and remote.health()[0] == 503
    assert not remote.ready_file.exists()
    register_gpus(remote.register_port, 2)
    assert "2/2 GPU ranks registered" in remote.wait_state("starting_engine")["detail"]
    body = remote.wait_state("ready")
    assert remote.health()[0] == 200 and body["node_rank"] == 1
    assert json.loads(remote.ready_file.read_text())["state"] == "ready"
    assert master.is_ready() and master.submit(7) == {"op_id": 7, "completed": True}
    workers = next(r["workers"] for r in remote.recorded() if "workers" in r)
    assert set(workers) <= set(remote.children) and len(workers) == 2

    code, err, took = remote.stop(signal.SIGTERM)
    assert code == ExitCode.OK, err
    assert took < 6, took  # grace_s
    assert remote.orphans() == []
    assert not remote.ready_file.exists()
    assert list(remote.ipc.iterdir()) == []  # the register and control socket files are gone
    seen = remote.recorded()
    assert seen[0]["cuda_visible_devices"] is None and "cleared CUDA_VISIBLE_DEVICES='0,1'" in err
    assert {"registered": [[0, 0], [0, 1]]} in seen
    assert sorted(r["worker_exit"] for r in seen if r.get("how") == "sentinel") == sorted(workers)  # unpinned
    assert {"term": True} not in seen  # FlexKV's shutdown() (which hangs in term()) was never called
    assert remote.states(err) == ORDER[:-1]


@pytest.mark.parametrize(
    ("state", "sig"),
    [
        ("waiting_for_master", signal.SIGTERM),
        ("handshake", signal.SIGTERM),
        ("waiting_for_gpus", signal.SIGINT),
        ("starting_engine", signal.SIGTERM),
        ("ready", signal.SIGHUP),
    ],
)
def test_a_stop_signal_in_every_state_exits_0_within_grace_without_descendants(tmp_path, master_for, state, sig):
    remote = Remote(tmp_path, env={"STANDIN_ALLOC_S": "30" if state == "starting_engine" else "0.1"})
    if state != "waiting_for_master":
        master_for(remote, gpus=1)
    if state in ("starting_engine", "ready"):
        remote.wait_state("waiting_for_gpus")
        register_gpus(remote.register_port, 1)
    remote.wait_state(state)
    code, err, took = remote.stop(sig)
    assert code == ExitCode.OK, err
    assert took < 6 and remote.orphans() == []
    assert not remote.ready_file.exists()
    states = remote.states(err)
    assert states[-1] == "shutting_down" or state == "waiting_for_master"
    assert_forward(states)


def test_a_signal_before_the_handshake_never_consumes_node_0s_config(tmp_path, master_for):
    remote = Remote(tmp_path, env={"STANDIN_IMPORT_S": "60"})  # FlexKV's import (torch, CUDA) can outlast grace_s
    master = master_for(remote, gpus=1)
    marker = tmp_path / "standin.jsonl.importing"
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    code, err, took = remote.stop(signal.SIGTERM)
    assert code == ExitCode.OK, err
    assert took < 6, took  # grace_s, though the import goes on
    assert "stopped before connecting to the master" in err and "handshake" not in remote.states(err)
    time.sleep(0.3)
    assert not master.config_sent.is_set()
    (tmp_path / "next").mkdir()
    later = Remote(tmp_path / "next", ports=remote.ports, ipc=remote.ipc)  # the config is still there for it
    later.wait_state("waiting_for_gpus")
    assert master.config_sent.is_set()
    assert later.stop()[0] == ExitCode.OK


def test_a_restart_while_node_0_stays_up_exits_11_explaining_the_one_shot_config(tmp_path, master_for):
    first = Remote(tmp_path)
    master_for(first, gpus=1)
    first.wait_state("waiting_for_gpus")
    assert first.stop()[0] == ExitCode.OK
    (tmp_path / "again").mkdir()
    again = Remote(tmp_path / "again", ports=first.ports, handshake_timeout=1)
    code, _, err = again.finish()
    last = error_line(err)
    assert code == ExitCode.HANDSHAKE_TIMEOUT, err
    assert "sends its config once" in last and "restart node 0's engine" in last


def test_losing_the_master_after_ready_is_final(tmp_path, master_for):
    remote = Remote(tmp_path)
    master = to_ready(remote, master_for, gpus=1)
    master.close()
    started = time.monotonic()
    code, _, err = remote.finish()
    assert code == ExitCode.MASTER_LOST and "never re-handshakes" in error_line(err)
    assert time.monotonic() - started < 6 and remote.orphans() == []


def test_a_restarted_master_is_not_served_by_the_stale_remote(tmp_path, master_for):
    remote = Remote(tmp_path, master_lost=30, probe_interval=5)
    master = to_ready(remote, master_for, gpus=1)
    master.close()
    restarted = master_for(remote, gpus=1)  # same ports at once: TCP probes would never notice
    code, _, err = remote.finish()
    assert code == ExitCode.MASTER_LOST, err
    assert "connection closed" in error_line(err)
    assert not restarted.config_sent.is_set() and remote.orphans() == []


def test_a_master_restart_between_handshake_and_ready_is_final_too(tmp_path, master_for):
    """The config is bound to the master that sent it: a restart while GPUs register must not
    leave a remote that later answers ready to a master whose config it ignores."""
    remote = Remote(tmp_path, master_lost=30, probe_interval=5)
    first = master_for(remote, gpus=1)
    remote.wait_state("waiting_for_gpus")
    first.close()
    master_for(remote, gpus=1)  # same ports at once
    started = time.monotonic()
    code, _, err = remote.finish()
    assert code == ExitCode.MASTER_LOST, err
    assert "in waiting_for_gpus" in error_line(err) and "connection closed" in error_line(err)
    assert time.monotonic() - started < 6 and remote.orphans() == []
    assert list(remote.ipc.iterdir()) == []  # the register and control socket files are gone


def test_the_gpu_deadline_names_the_register_port_bound_from_the_masters_config(tmp_path, master_for):
    remote = Remote(tmp_path, gpu_timeout=1)
    node0_port = f"ipc://{remote.ipc}/node0_gpu_register"  # node 0's FLEXKV_SERVER_RECV_PORT differs
    master_for(remote, gpus=2, register_port=node0_port)
    remote.wait_state("waiting_for_gpus")
    register_gpus(node0_port, 1)
    code, _, err = remote.finish()
    last = error_line(err)
    assert code == ExitCode.GPU_TIMEOUT, err
    assert f"1/2 local GPU ranks registered with {node0_port} (bound from the master's config)" in last
    assert f"local setting: {remote.register_port}" in last


def test_engine_start_up_has_its_own_deadline(tmp_path, master_for):
    remote = Remote(tmp_path, engine_timeout=1, env={"STANDIN_ALLOC_S": "30"})
    master_for(remote, gpus=1)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, 1)
    code, _, err = remote.finish()
    assert code == ExitCode.ENGINE_TIMEOUT and "timed out in starting_engine" in err, err
    assert remote.states(err)[-3:] == ["starting_engine", "shutting_down", "failed"]


STUCK = {"STANDIN_UNPIN_S": "30", "STANDIN_WORKER_STUCK": "1"}


def test_workers_slower_than_the_grace_period_or_a_second_signal_force_exit(tmp_path, master_for):
    remote = Remote(tmp_path, grace=2, reap_grace=0.5, env=STUCK)
    to_ready(remote, master_for, gpus=1)
    code, err, took = remote.stop()
    assert code == ExitCode.FORCED and "had to be killed" in err, err
    assert took < 2 + 1.5 and remote.orphans() == []  # grace_s, and slack for a loaded machine (the workers: 30 s)

    (tmp_path / "second").mkdir()
    second = Remote(tmp_path / "second", grace=30, reap_grace=25, env=STUCK)
    to_ready(second, master_for, gpus=1)
    second.proc.send_signal(signal.SIGTERM)
    second.wait_state("shutting_down")
    code, err, took = second.stop(signal.SIGINT)
    assert code == ExitCode.FORCED and "another signal during shutdown" in err
    assert took < 5 and second.orphans() == []  # at once: grace_s is 30 here


def test_sigusr1_logs_the_state_and_keeps_running(tmp_path, master_for):
    remote = Remote(tmp_path)
    to_ready(remote, master_for, gpus=1)
    remote.proc.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
    assert remote.health()[0] == 200 and remote.ready_file.exists()
    code, err, _ = remote.stop()
    assert code == ExitCode.OK and "received SIGUSR1: {'state': 'ready'" in err
    assert not remote.ready_file.exists()


def test_master_late_is_waited_for_and_master_never_up_hits_the_connect_deadline(tmp_path, master_for):
    remote = Remote(tmp_path)
    remote.wait_state("waiting_for_master")  # not a fixed sleep: torch's import alone can take longer under load
    time.sleep(0.5)  # a few 0.2 s connect retries
    to_ready(remote, master_for, gpus=1)
    code, err, _ = remote.stop(signal.SIGINT)
    assert code == ExitCode.OK and "retry in 0.2s" in err and "Connection refused" in err

    (tmp_path / "never").mkdir()
    never = Remote(tmp_path / "never", connect_timeout=0.5)
    code, _, err = never.finish()
    assert code == ExitCode.MASTER_UNREACHABLE and "not reachable within 0.5s" in error_line(err)


def test_a_transfer_manager_that_raises_exits_14(tmp_path, master_for):
    remote = Remote(tmp_path)
    master_for(remote, gpus=1, config={"type": "hello"})
    code, _, err = remote.finish()
    assert code == ExitCode.CRASHED and "Expected config message" in error_line(err)


def test_a_second_instance_for_the_same_master_is_refused_however_the_host_is_spelled(tmp_path):
    first = Remote(tmp_path)
    first.wait_state("waiting_for_master")
    second = Remote(tmp_path, ports=first.ports, master_host="localhost")
    code, _, err = second.finish()
    assert code == ExitCode.ALREADY_RUNNING and f"pid {first.proc.pid}" in err
    (tmp_path / "elsewhere").mkdir()  # another lock dir: a unit without XDG_RUNTIME_DIR next to a login shell
    third = Remote(tmp_path / "elsewhere", ports=first.ports)
    code, _, err = third.finish()
    assert code == ExitCode.ALREADY_RUNNING and f"pid {first.proc.pid}" in err
    assert first.stop()[0] == ExitCode.OK


def test_dry_run_validates_preflights_and_prints_the_plan(tmp_path, master_for):
    remote = Remote(tmp_path, "--dry-run")
    master_for(remote)
    code, out, err = remote.finish()
    assert code == ExitCode.OK, err
    plan = json.loads(out)
    assert plan["master"] == {"host": "127.0.0.1", "ports": list(remote.ports)}
    assert plan["gpu_register_port"] == remote.register_port
    assert plan["deadlines_s"]["engine_start"] == 20 and plan["deadlines_s"]["reap_grace"] == 4
    assert not remote.state_file.exists()  # nothing started


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
        (["--nnodes", "2", "--node-rank", "1", "--master-host", "[fd00::1]"], None, ExitCode.SETTINGS, "IPv6"),
    ],
    ids=[
        "node-rank-0",
        "loopback",
        "duplicate-ports",
        "invalid-port",
        "bad-rank",
        "flexkv-missing",
        "no-master",
        "ipv6-master",
    ],
)
def test_refusals_have_one_line_errors_and_distinct_statuses(tmp_path, argv, env, code, message):
    got, line = run_once("--lock-dir", str(tmp_path), *argv, env=env)
    assert got == code and message in line, line


def test_flexkv_adapter_start_remote_is_the_same_entry_point(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("flexkv-adapter")
    done = subprocess.run(
        [str(exe), "start-remote", "--node-rank", "0", "--master-host", "10.0.0.1", "--lock-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == ExitCode.NODE_RANK_ZERO
