"""Fixtures of the two-node tier: a fresh namespace pair, ipc and lock directories, and processes
that are killed at the end of each test whatever happened."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..flexkv_source import find
from .netns import NetnsUnavailable, TwoNodes, two_nodes
from .nodes import Master, Proc, StartRemote, node_ports


class Deployment:
    """One test's two nodes, master ports, ipc directory and lock directory; spawns are tracked."""

    def __init__(self, nodes: TwoNodes, ipc: Path, locks: Path) -> None:
        self.nodes, self.ipc, self.locks = nodes, ipc, locks
        self.ports = node_ports()
        self.procs: list[Proc] = []

    def master(self, hold: bool = False) -> Master:
        master = Master(self.nodes.a, self.ports, f"ipc://{self.ipc}/srv_gpu_register", hold=hold)
        self.procs.append(master)
        return master

    def start_remote(self, **flags: object) -> StartRemote:
        remote = StartRemote(self.nodes.b, self.nodes.a, self.ports, self.ipc, self.locks, **flags)
        self.procs.append(remote)
        return remote


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    found = find()
    if found.root is None:
        pytest.skip(f"two-node tier skipped: {found.skip_reason}")
    ipc = Path(tempfile.mkdtemp(prefix="fkn", dir="/tmp"))  # short: unix socket paths
    locks = tmp_path / "locks"
    locks.mkdir()
    try:
        with two_nodes() as nodes:
            d = Deployment(nodes, ipc, locks)
            try:
                yield d
            finally:
                for proc in d.procs:
                    proc.kill()
    except NetnsUnavailable as exc:
        pytest.skip(f"two-node tier skipped: {exc}")
    finally:
        shutil.rmtree(ipc, ignore_errors=True)
