"""start_remote's ``transfer_manager`` on node B: FlexKV's real ``TransferManagerOnRemote``.

Its constructor (connect, the one config, the register/control sockets), its GPU registration loop
and its polling worker (``query_ready``, commands, GPU control) are FlexKV's. Only the engine that
follows the registration is replaced: ``StorageEngine`` pins the CPU cache with CUDA and
``TransferEngine`` runs CUDA copy workers, neither of which a CPU-only machine has.
"""

from __future__ import annotations

import queue
import sys
from typing import Any

from . import flexkv_cpu

_tm = flexkv_cpu.load()


class CPUTransferEngine:
    """The part of ``TransferEngine`` the remote's polling worker calls: completions, by a queue."""

    def __init__(self) -> None:
        self.completed_queue: queue.Queue[Any] = queue.Queue()
        self.started = False

    def start(self) -> None:
        self.started = True

    def submit_transfer_graph(self, graphs: Any) -> None:
        pass  # no data plane here: a graph never completes

    def get_completed_graphs_and_ops(self, timeout: float | None = None) -> list[Any]:
        try:  # as FlexKV's: block up to timeout for the first one (no busy spin)
            first = self.completed_queue.get(timeout=timeout) if timeout else self.completed_queue.get_nowait()
        except queue.Empty:
            return []
        return [first]

    def shutdown(self) -> None:
        self.started = False


class CPURemote(_tm.TransferManagerOnRemote):  # type: ignore[misc,name-defined]
    """FlexKV's remote transfer manager with the CUDA engine replaced (see the module docstring)."""

    def initialize_transfer_engine(self) -> None:
        self._register_gpu_blocks_via_socket()  # FlexKV's: waits until every local rank registered
        self.transfer_engine = CPUTransferEngine()


def register(register_port: str, ranks: int) -> None:
    """Node B's GPU ranks: each PUSHes FlexKV's ``RegisterTPClientRequest`` to the node-local port."""
    import zmq
    from flexkv.server.request import RegisterTPClientRequest

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(register_port)
    for rank in range(ranks):
        request = RegisterTPClientRequest(
            dp_client_id=0, pp_rank=0, intra_client_id=rank, device_id=rank, handles=[], gpu_layout=None
        )
        sock.send_pyobj(request)
    sock.close(linger=60000)  # delivered once start_remote binds the port (it may not yet)
    ctx.term()


if __name__ == "__main__":  # python -m tests.remote_netns.flexkv_remote REGISTER_PORT RANKS
    register(sys.argv[1], int(sys.argv[2]))
