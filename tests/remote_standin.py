"""A stand-in for FlexKV's ``TransferManagerOnRemote`` that speaks its protocol (contract §3.3-3.5).

FlexKV's engine cannot run here. This class does what the real remote does on the wire: it
*connects* PULL to the master's command port, PUSH to the result port and REP to the query port
(``tcp://{master_host}:{port}``, ``LINGER 0``), blocks without timeout on the pickled
``{'type': 'config', 'model_config', 'cache_config', 'gpu_register_port'}`` message, binds the
node-local ``gpu_register_port`` PULL, and in ``start()`` waits without timeout for
``expected_gpus = instance_num * gpus_per_node`` registrations (deduplicated by
``(dp_client_id, intra_client_id)``), then sets ``_is_ready`` and serves ``{'type': 'query_ready'}``
with ``{'ready': bool}`` and acknowledges submitted graphs on the result port. Like FlexKV's, it
starts worker processes, and its ``shutdown()`` does not reap them (the supervisor must).

Test knobs (environment): ``STANDIN_CHILD_PIDFILE`` (write the worker's pid there),
``STANDIN_SHUTDOWN_HANG`` (shutdown never returns), ``STANDIN_STATE_FILE`` (record what it saw).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import zmq


class StandInRemote:
    def __init__(self, master_host: str, master_ports: tuple[str, str, str]) -> None:
        self._ctx = zmq.Context()
        self._sockets = []

        def connect(kind: int, port: str) -> zmq.Socket:
            sock = self._ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{master_host}:{port}")
            self._sockets.append(sock)
            return sock

        self.command_socket = connect(zmq.PULL, master_ports[0])
        self.result_socket = connect(zmq.PUSH, master_ports[1])
        self.query_socket = connect(zmq.REP, master_ports[2])
        message = self.command_socket.recv_pyobj()  # no timeout, as FlexKV
        assert message["type"] == "config", message
        self.model_config = message["model_config"]
        self.cache_config = message["cache_config"]
        self.gpu_register_port = message["gpu_register_port"]
        self.expected_gpus = self.model_config["instance_num"] * self.model_config["gpus_per_node"]
        self.register_socket = self._ctx.socket(zmq.PULL)
        self.register_socket.setsockopt(zmq.LINGER, 0)
        self.register_socket.bind(self.gpu_register_port)
        self._sockets.append(self.register_socket)
        self._is_ready = False
        self._stop = threading.Event()
        self._record(cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), master_ports=list(master_ports))

    def _record(self, **facts: object) -> None:
        path = os.environ.get("STANDIN_STATE_FILE")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(facts) + "\n")

    def start(self) -> None:
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if os.environ.get("STANDIN_CHILD_PIDFILE"):
            with open(os.environ["STANDIN_CHILD_PIDFILE"], "w") as f:
                f.write(str(worker.pid))
        self._worker_thread = threading.Thread(target=self._run, daemon=True)
        self._worker_thread.start()

    def _run(self) -> None:
        registered: set[tuple[int, int]] = set()
        while len(registered) < self.expected_gpus and not self._stop.is_set():
            if self.register_socket.poll(50):
                request = self.register_socket.recv_pyobj()
                registered.add((request["dp_client_id"], request["intra_client_id"]))
        if self._stop.is_set():
            return
        self._is_ready = True
        self._record(registered=sorted(registered))
        poller = zmq.Poller()
        poller.register(self.command_socket, zmq.POLLIN)
        poller.register(self.query_socket, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(50):
                message = sock.recv_pyobj()
                if sock is self.query_socket:
                    sock.send_pyobj({"ready": self._is_ready})
                elif message.get("type") == "submit":
                    self.result_socket.send_pyobj({"op_id": message["task_end_op_id"], "completed": True})

    def shutdown(self) -> None:
        if os.environ.get("STANDIN_SHUTDOWN_HANG"):
            time.sleep(3600)
        self._stop.set()
        if hasattr(self, "_worker_thread"):
            self._worker_thread.join(2)
        for sock in self._sockets:
            sock.close()
        self._record(shutdown=True)


class MasterStandIn:
    """Node 0's side, as FlexKV's ``TransferManagerMultiNodeHandle`` binds it (contract §3.3)."""

    def __init__(self, host: str, ports: tuple[int, int, int]) -> None:
        self._ctx = zmq.Context()
        self.command = self._bind(zmq.PUSH, host, ports[0])
        self.result = self._bind(zmq.PULL, host, ports[1])
        self.query = self._bind(zmq.REQ, host, ports[2])
        self.query.setsockopt(zmq.RCVTIMEO, 1000)
        self.query.setsockopt(zmq.REQ_RELAXED, 1)
        self.query.setsockopt(zmq.REQ_CORRELATE, 1)

    def _bind(self, kind: int, host: str, port: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(f"tcp://{host}:{port}")
        return sock

    def send_config(self, gpu_register_port: str, gpus_per_node: int = 2) -> None:
        """Blocks until a remote connects (PUSH without SNDTIMEO), as FlexKV's master does."""
        self.command.send_pyobj(
            {
                "type": "config",
                "model_config": {"instance_num": 1, "gpus_per_node": gpus_per_node, "num_layers": 2},
                "cache_config": {"tokens_per_block": 16},
                "gpu_register_port": gpu_register_port,
            }
        )

    def is_ready(self) -> bool:
        try:
            self.query.send_pyobj({"type": "query_ready"})
            return bool(self.query.recv_pyobj()["ready"])
        except zmq.Again:
            return False

    def submit(self, op_id: int) -> dict:
        self.command.send_pyobj({"type": "submit", "graph": None, "task_end_op_id": op_id})
        self.result.setsockopt(zmq.RCVTIMEO, 2000)
        return self.result.recv_pyobj()

    def close(self) -> None:
        for sock in (self.command, self.result, self.query):
            sock.close()
        self._ctx.term()


def register_gpus(gpu_register_port: str, count: int) -> None:
    """What each local rank's KVTPClient does: PUSH a registration to the node-local port."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(gpu_register_port)
    for rank in range(count):
        sock.send_pyobj({"dp_client_id": 0, "intra_client_id": rank, "device_id": rank, "handles": []})
    sock.close(linger=2000)
    ctx.term()
