"""Fixtures of the two-node tier: a fresh namespace pair, ipc and lock directories, and processes
that are killed at the end of each test whatever happened."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..flexkv_source import find
from .netns import NetnsUnavailable, TwoNodes, two_nodes
from .nodes import Master, Proc, Relay, StartRemote, node_ports
from .relay import LinkSpec


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "link(delay_s, loss, seed): the test's link runs through relay.py with that delay and loss"
    )


class Deployment:
    """One test's two nodes, master ports, ipc directory and lock directory; spawns are tracked."""

    def __init__(self, nodes: TwoNodes, ipc: Path, locks: Path) -> None:
        self.nodes, self.ipc, self.locks = nodes, ipc, locks
        self.ports = node_ports()
        self.procs: list[Proc] = []
        self.relay: Relay | None = None

    def master(self, hold: bool = False) -> Master:
        master = Master(self.nodes.a, self.ports, f"ipc://{self.ipc}/srv_gpu_register", hold=hold)
        self.procs.append(master)
        return master

    def start_remote(self, **flags: object) -> StartRemote:
        remote = StartRemote(self.nodes.b, self.nodes.a, self.ports, self.ipc, self.locks, **flags)
        self.procs.append(remote)
        return remote


@pytest.fixture
def deployment(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """``@pytest.mark.link(delay_s=..., loss=..., seed=...)``: node B reaches node A through the relay."""
    marked = request.node.get_closest_marker("link")
    link = LinkSpec(**marked.kwargs) if marked else None
    found = find()
    if found.root is None:
        pytest.skip(f"two-node tier skipped: {found.skip_reason}")
    ipc = Path(tempfile.mkdtemp(prefix="fkn", dir="/tmp"))  # short: unix socket paths
    locks = tmp_path / "locks"
    locks.mkdir()
    try:
        with two_nodes(relayed=link is not None) as nodes:
            d = Deployment(nodes, ipc, locks)
            try:
                if link is not None:
                    assert nodes.between is not None
                    d.relay = Relay(nodes.between, link)
                    d.procs.append(d.relay)
                yield d
            finally:
                for proc in d.procs:
                    proc.kill()
    except NetnsUnavailable as exc:
        pytest.skip(f"two-node tier skipped: {exc}")
    finally:
        shutil.rmtree(ipc, ignore_errors=True)


def reach_ready(d: Deployment, **flags: object) -> tuple[Master, StartRemote]:
    """Master up on A, start_remote on B through handshake and registration to ready."""
    master = d.master()
    remote = d.start_remote(**flags)
    remote.register(2)  # node B's ranks, importing meanwhile
    master.wait_line("bound")
    remote.wait_state("waiting_for_gpus")
    master.wait_line("config-sent", 10)
    remote.wait_state("ready", 30)
    return master, remote


def exit_10_within(deployment: Deployment, fault: Callable[[], object], connect_timeout_s: float) -> float:
    """With ``fault`` made after the master bound, start_remote ends in exit 10 within connect_timeout_s
    (+1 s) of saying it waits for the master; how long it took."""
    master = deployment.master()
    master.wait_line("bound")
    fault()
    remote = deployment.start_remote(connect_timeout=connect_timeout_s)
    waiting = remote.wait_state("waiting_for_master")
    code, at, err = remote.finish(connect_timeout_s + 10)
    assert code == 10, err[-2000:]
    took = at - waiting
    assert connect_timeout_s - 0.2 <= took <= connect_timeout_s + 1.0, (took, err[-2000:])
    assert "not reachable within" in err
    return took
