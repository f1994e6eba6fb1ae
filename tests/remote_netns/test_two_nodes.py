"""start_remote across a real network link: FlexKV's master on node A, start_remote on node B.

Two network namespaces joined by a veth pair, each with its own non-loopback address
(``10.213.x.y``, a fresh subnet per test), stand for node 0 and node 1. FlexKV's real
``TransferManagerMultiNodeHandle`` (``../shared/flexkv-34ab141``, compiled parts replaced) binds
node A's address; ``scripts/start_remote.py`` runs on node B with ``--master-host`` set to it and
without ``--allow-loopback-master``, driving FlexKV's real ``TransferManagerOnRemote`` (its CUDA
storage and transfer engines replaced). The faults are made on the link: cut (``ip link set
down``: connects fail at once), or black-holed (a permanent neighbour entry to a MAC nobody has:
packets vanish while the link stays up, the case loopback can never show).

Limits of the simulation (real nodes differ here):

- the two "nodes" share the filesystem and the process list. ipc sockets (the register port,
  ready files) and start_remote's check for a FlexKV-spawned remote reach across them, which they
  do not between machines; so each test has its own ipc directory, lock directory and master ports;
- start_remote's lock is per ``lock_dir`` here: its machine-wide abstract unix socket lives in a
  network namespace, so a remote on node A and one on node B would not see each other's;
- the link is a veth pair: no switch, no MTU or routing problems, no clock skew; delay and loss
  (the kernel here has no netem) are made by a userspace relay in test_slow_link.py.

Without root or iproute2 every test is skipped and says why.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable

from .conftest import Deployment, exit_10_within, reach_ready

MASTER_LOST_S, PROBE_S, FAILED_VISIBLE_S = 2.0, 0.3, 0.2


def test_start_remote_on_node_b_reaches_ready_with_node_a_master(deployment: Deployment):
    master, remote = reach_ready(deployment)
    assert master.is_ready() is True  # FlexKV's query_ready, across the link, answered by the remote
    ready = json.loads(remote.ready_file.read_text())
    assert ready["state"] == "ready" and ready["master"] == f"{deployment.nodes.a.address}:{deployment.ports[0]}"
    remote.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code, at, err = remote.finish(10)
    assert code == 0, err[-2000:]
    assert at - sent < 3
    assert "WARNING start_remote: master_host" not in err  # a private address: no public-address warning


def _exit_13_after(deployment: Deployment, fault: Callable[[], object]) -> tuple[float, str]:
    """From ready, ``fault`` on the link ends in exit 13 within master_lost_s plus a probe, the
    failed_visible_s and 2.5 s of slack; how long after the fault, and start_remote's log."""
    _, remote = reach_ready(deployment)
    fault()
    cut = time.monotonic()
    code, at, err = remote.finish(MASTER_LOST_S + 8)
    assert code == 13, err[-2000:]
    assert at - cut <= MASTER_LOST_S + PROBE_S + FAILED_VISIBLE_S + 2.5, at - cut
    assert "lost master" in err
    return at - cut, err


def test_link_down_while_ready_is_exit_13_after_master_lost(deployment: Deployment):
    took, _ = _exit_13_after(deployment, lambda: deployment.nodes.link(False))
    assert took >= MASTER_LOST_S - 0.5, took  # the heartbeats' timeout, not a closed connection


def test_an_outage_shorter_than_master_lost_stays_ready(deployment: Deployment):
    master, remote = reach_ready(deployment, master_lost=3)
    deployment.nodes.link(False)
    time.sleep(1.0)
    deployment.nodes.link(True)
    deployment.nodes.wait_carrier()
    code, _ = remote.exit(4.0)  # past master_lost_s since the cut
    assert code is None and remote.in_state("ready"), remote.err.text()[-2000:]
    assert master.is_ready() is True


def test_link_down_before_connecting_is_exit_10_within_connect_timeout(deployment: Deployment):
    exit_10_within(deployment, lambda: deployment.nodes.link(False), 3)


def test_black_holed_master_before_connecting_is_exit_10_within_connect_timeout(deployment: Deployment):
    """Every connect only times out here: no poll may run past connect_timeout_s. (A poll of the
    three ports unbounded by the deadline takes 3 s: exit 10 came at 3 s for 1.5 s, at 6.1 s for 4 s.)"""
    exit_10_within(deployment, lambda: deployment.nodes.black_hole(True), 1.5)


def test_black_hole_while_ready_is_exit_13(deployment: Deployment):
    _exit_13_after(deployment, lambda: deployment.nodes.black_hole(True))


def test_black_hole_before_the_config_is_exit_11_after_handshake_timeout(deployment: Deployment):
    master = deployment.master(hold=True)  # bound, but node 0's engine has not sent its config yet
    remote = deployment.start_remote(handshake_timeout=3)
    handshake = remote.wait_state("handshake")
    time.sleep(0.3)  # the ZMQ connections are up
    deployment.nodes.black_hole(True)
    master.send()  # into the black hole
    code, at, err = remote.finish(15)
    assert code == 11, err[-2000:]
    assert 3 - 0.2 <= at - handshake <= 3 + 1.5, at - handshake
    assert "no config from master" in err


def test_an_outage_before_the_config_still_lets_it_arrive(deployment: Deployment):
    master = deployment.master(hold=True)
    remote = deployment.start_remote(handshake_timeout=10)
    remote.register(2)
    remote.wait_state("handshake")
    time.sleep(0.3)
    deployment.nodes.link(False)
    master.send()
    time.sleep(1.5)
    deployment.nodes.link(True)
    remote.wait_state("waiting_for_gpus", 10)  # TCP retransmits deliver the one config after the outage
    remote.wait_state("ready", 30)
    assert master.is_ready() is True


def test_master_killed_is_exit_13_at_once_and_a_restarted_master_gets_a_new_remote(deployment: Deployment):
    """The closed connection is noticed, not the heartbeats' silence: master_lost_s is 60 s here, so an
    exit within 15 s can only come from the disconnect (the time also holds the manager's shutdown). The
    master dies once the watch says it is connected: before, it would be a master never reached."""
    master, remote = reach_ready(deployment, master_lost=60)
    # the watch connects after ready: a master killed before that is a master never reached (master_lost_s)
    assert remote.err.wait(lambda line: "watching master" in line, 10, remote.alive) is not None, remote.err.text()
    master.kill()
    killed = time.monotonic()
    code, at, err = remote.finish(15)
    assert code == 13, err[-2000:]
    assert at - killed < 15, at - killed
    assert "its connection closed" in err, err[-2000:]
    again = deployment.master()  # node 0's engine restarted: same ports, a new config
    fresh = deployment.start_remote()
    fresh.register(2)
    again.wait_line("bound")
    fresh.wait_state("ready")
    assert again.is_ready() is True


def _engine_wait(deployment: Deployment, node, health_port: int, absent_s: float):
    """The engine side of ``remote: external`` (integrations/sglang/external_remote.py) run on ``node``."""
    import subprocess

    from ..remote.harness import ROOT, clean_env

    code = (
        "import sys\n"
        "from flexkv_adapter import load_settings\n"
        "from flexkv_adapter.integrations.sglang.external_remote import wait_for_start_remote, ExternalRemoteError\n"
        f"s = load_settings(health_port={health_port}, remote_wait_s=30, remote_absent_s={absent_s})\n"
        "try:\n"
        f"    h = wait_for_start_remote(s, {deployment.nodes.a.address!r}, {tuple(map(str, deployment.ports))!r})\n"
        "except ExternalRemoteError as exc:\n"
        "    print('refused', exc); sys.exit(1)\n"
        "print('proceeds', h.source)\n"
    )
    return subprocess.run(
        [*node.exec_prefix(), sys.executable, "-c", code],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_remote_external_engine_on_node_b_waits_for_start_remote_across_the_link(deployment: Deployment):
    health_port = 18000 + deployment.ports[0] % 1000
    master = deployment.master()
    remote = deployment.start_remote(health_port=health_port)
    master.wait_line("bound")
    remote.wait_state("waiting_for_master")  # its health endpoint listens from here on
    seen = _engine_wait(deployment, deployment.nodes.b, health_port, absent_s=10)
    assert seen.returncode == 0 and "proceeds" in seen.stdout, seen.stdout + seen.stderr[-2000:]
    said = seen.stdout.split("state ", 1)[-1].split()[0]  # what start_remote's health said when the wait ended
    assert said in ("waiting_for_gpus", "starting_engine", "ready"), seen.stdout  # (its log line may lag)
    remote.register(2)  # the engine's ranks register once the wait returned, as they do in SGLang
    remote.wait_state("ready", 30)
    assert master.is_ready() is True
    # negative control: node A has no start_remote; its 127.0.0.1 is not node B's
    elsewhere = _engine_wait(deployment, deployment.nodes.a, health_port, absent_s=1)
    assert elsewhere.returncode == 1 and "not running on this node" in elsewhere.stdout, elsewhere.stdout
