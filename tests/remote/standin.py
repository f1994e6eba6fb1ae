"""Stand-ins for FlexKV's remote transfer manager and its master, faithful to their lifecycle.

What FlexKV's ``TransferManagerOnRemote`` does (reference/flexkv_consumers.md §5), reproduced here
with real sockets and processes, because the awkward parts are what start_remote must survive:

- the constructor connects PULL/PUSH/REP to the master's command/result/query ports and blocks in
  ``recv_pyobj()`` (no timeout) for the one config message; it then binds the node-local
  ``gpu_register_port`` PULL and ``<port>_control`` REP on a *new* ``zmq.Context`` (the first one
  keeps the three connected sockets);
- ``_is_ready`` is a plain attribute; ``start()`` blocks: it waits (no timeout, a log line every 5 s)
  until ``len(all_gpu_blocks) == expected_gpus``, then "allocates and pins" the CPU cache
  (``STANDIN_ALLOC_S`` seconds) and spawns one worker per GPU (``multiprocessing`` spawn, daemon);
  workers ignore SIGINT, leave after ``STANDIN_UNPIN_S`` seconds of "unpinning" on SIGTERM or on
  the engine's sentinel, and leave when the pipe to their parent closes (``STANDIN_WORKER_STUCK``:
  a worker stuck in a driver call while unpinning, deaf to signals);
- ``shutdown()`` before ``start()`` finished raises AttributeError (``transfer_engine`` is None);
  after ready it stops the workers, closes the three connected sockets, then hangs for ever in
  ``context.term()`` because the bound register/control sockets are still open; ``__del__`` calls it
  when a manager that was not shut down is dropped;
- ``transfer_engine`` is set before its workers are spawned; the polling thread logs and survives
  messages it cannot unpickle or does not know (a second config is "Unexpected command message").

The master sends its config exactly once per lifetime, from a thread blocked in ``send`` until
the first remote connects, like ``TransferManagerMultiNodeHandle.send_config_to_remotes``.
``STANDIN_STATE_FILE`` (JSON lines) records what the stand-in saw and how each worker ended;
``STANDIN_IMPORT_S`` makes importing this module slow, like importing FlexKV.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any

import zmq

log = logging.getLogger("standin")

if os.environ.get("STANDIN_IMPORT_S"):  # a slow import (FlexKV pulls in torch), announced for the tests
    open(os.environ["STANDIN_STATE_FILE"] + ".importing", "w").close()
    time.sleep(float(os.environ["STANDIN_IMPORT_S"]))


def _record(**facts: object) -> None:
    path = os.environ.get("STANDIN_STATE_FILE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(facts) + "\n")


def _worker_main(conn: Any, ready: Any, unpin_s: float) -> None:
    """One transfer worker: SIGINT ignored, SIGTERM -> unpin and exit, EOF on the pipe -> exit."""

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_sigterm)
    how = "eof"
    ready.set()
    try:
        while conn.recv() is not None:
            pass
        how = "sentinel"
    except EOFError:
        pass
    except SystemExit:
        how = "sigterm"
    finally:
        if os.environ.get("STANDIN_WORKER_STUCK"):  # stuck in a driver call: signals stay pending
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        time.sleep(unpin_s)  # unpinning; a second SIGTERM would cut it short, as in FlexKV
        _record(worker_exit=os.getpid(), how=how)


class StandInEngine:
    """The transfer engine: constructed first, ``start()`` spawns one worker per GPU; shutdown sends
    sentinels and joins. As in FlexKV, ``transfer_engine`` is set before its workers exist."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.workers: list[tuple[Any, Any, Any]] = []

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        unpin_s = float(os.environ.get("STANDIN_UNPIN_S", "0.3"))
        for _ in range(self.gpus):
            parent, child = ctx.Pipe()
            ready = ctx.Event()
            proc = ctx.Process(target=_worker_main, args=(child, ready, unpin_s), daemon=True)
            proc.start()
            self.workers.append((parent, proc, ready))
        for _, _, ready in self.workers:
            ready.wait(60)
        _record(workers=[proc.pid for _, proc, _ in self.workers])

    def shutdown(self) -> None:
        for conn, _, _ in self.workers:
            with contextlib.suppress(OSError):
                conn.send(None)
        for _, proc, _ in self.workers:
            proc.join(600)  # FlexKV: FLEXKV_WORKER_SHUTDOWN_TIMEOUT_S, default 600 s


class StandInRemote:
    """``TransferManagerOnRemote(master_host, master_ports)`` with the same attributes and hangs."""

    def __init__(self, master_host: str, master_ports: tuple[str, str, str]) -> None:
        self.context = zmq.Context()
        self.command_socket = self.context.socket(zmq.PULL)
        self.result_socket = self.context.socket(zmq.PUSH)
        self.query_socket = self.context.socket(zmq.REP)
        for sock in (self.command_socket, self.result_socket, self.query_socket):
            sock.setsockopt(zmq.LINGER, 0)
        self._shutdown_flag = False
        self._is_ready = False
        self._worker_thread: threading.Thread | None = None
        self.command_socket.connect(f"tcp://{master_host}:{master_ports[0]}")
        self.result_socket.connect(f"tcp://{master_host}:{master_ports[1]}")
        self.query_socket.connect(f"tcp://{master_host}:{master_ports[2]}")
        _record(cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), master_ports=list(master_ports))
        message = self.command_socket.recv_pyobj()  # no timeout, as FlexKV
        if not (isinstance(message, dict) and message.get("type") == "config"):
            raise RuntimeError(f"Expected config message, got: {message}")
        self.model_config = message["model_config"]
        self.gpu_register_port = message["gpu_register_port"]
        _record(config=True)
        # TransferManager.__init__: a second context holds the node-local bound sockets
        self.expected_gpus = self.model_config["instance_num"] * self.model_config["gpus_per_node"]
        self.all_gpu_blocks: dict[tuple[int, int], Any] = {}
        self.transfer_engine: StandInEngine | None = None
        self.context = zmq.Context(2)
        self.recv_from_client = self.context.socket(zmq.PULL)
        self.recv_from_client.bind(self.gpu_register_port)
        self.gpu_control_socket = self.context.socket(zmq.REP)
        self.gpu_control_socket.bind(f"{self.gpu_register_port}_control")

    def start(self) -> None:
        last_log = time.time()
        while len(self.all_gpu_blocks) < self.expected_gpus:
            try:
                req = self.recv_from_client.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                if time.time() - last_log >= 5.0:
                    log.info("Still waiting for GPU registrations: %d/%d", len(self.all_gpu_blocks), self.expected_gpus)
                    last_log = time.time()
                time.sleep(0.005)
                continue
            self.all_gpu_blocks.setdefault((req["dp_client_id"], req["intra_client_id"]), req["handles"])
        _record(registered=sorted(self.all_gpu_blocks))
        time.sleep(float(os.environ.get("STANDIN_ALLOC_S", "0.2")))  # StorageEngine: allocate and pin
        self.transfer_engine = StandInEngine(self.expected_gpus)
        self.transfer_engine.start()
        self._is_ready = True
        self._worker_thread = threading.Thread(target=self._polling_worker, daemon=True)
        self._worker_thread.start()

    def _polling_worker(self) -> None:
        """Serves command, query and control until shutdown; like FlexKV it logs and survives bad input."""
        poller = zmq.Poller()
        for sock in (self.command_socket, self.query_socket, self.gpu_control_socket):
            poller.register(sock, zmq.POLLIN)
        while not self._shutdown_flag:
            try:
                for sock, _ in poller.poll(10):
                    self._serve(sock, sock.recv_pyobj(zmq.NOBLOCK))
            except Exception as exc:  # an unpicklable or odd message: logged, the loop goes on
                if not self._shutdown_flag:
                    log.error("Error in polling worker: %s", exc)
                    _record(polling_error=type(exc).__name__)

    def _serve(self, sock: zmq.Socket, message: Any) -> None:
        if sock is self.gpu_control_socket:
            sock.send_pyobj({"ok": True})
        elif sock is self.query_socket:
            known = isinstance(message, dict) and message.get("type") == "query_ready"
            sock.send_pyobj({"ready": self._is_ready} if known else {"error": "unknown query type"})
        elif isinstance(message, dict) and message.get("type") == "submit":
            self.result_socket.send_pyobj({"op_id": message["task_end_op_id"], "completed": True})
        else:
            log.warning("Unexpected command message: %s", message)
            _record(unexpected=message.get("type") if isinstance(message, dict) else type(message).__name__)

    def shutdown(self) -> None:
        self._shutdown_flag = True
        self._is_ready = False
        if self._worker_thread is not None and self._worker_thread.is_alive():
            self._worker_thread.join(5.0)
        if hasattr(self, "transfer_engine"):  # set (None) once the config arrived: AttributeError before start
            self.transfer_engine.shutdown()  # type: ignore[union-attr]
        for sock in (self.command_socket, self.result_socket, self.query_socket):
            sock.close()
        _record(term=True)
        self.context.term()  # after ready, never returns: the bound register/control sockets are still open

    def __del__(self) -> None:  # FlexKV's: dropping a manager that was not shut down calls shutdown()
        if not self._shutdown_flag:
            self.shutdown()


class MasterStandIn:
    """Node 0's ``TransferManagerMultiNodeHandle``: binds the three ports, sends its config once."""

    def __init__(
        self, host: str, ports: tuple[int, int, int], gpu_register_port: str, gpus: int = 2, config: dict | None = None
    ) -> None:
        self._ctx = zmq.Context()
        self.command = self._bind(zmq.PUSH, host, ports[0])
        self.result = self._bind(zmq.PULL, host, ports[1])
        self.query = self._bind(zmq.REQ, host, ports[2])
        self.query.setsockopt(zmq.RCVTIMEO, 1000)
        self.query.setsockopt(zmq.REQ_RELAXED, 1)
        self.query.setsockopt(zmq.REQ_CORRELATE, 1)
        self.config = config or {
            "type": "config",
            "model_config": {"instance_num": 1, "gpus_per_node": gpus, "num_layers": 2},
            "cache_config": {"tokens_per_block": 16},
            "gpu_register_port": gpu_register_port,
        }
        self.config_sent = threading.Event()
        self._closing = threading.Event()
        self._sender = threading.Thread(target=self._send_config_once, daemon=True)
        self._sender.start()

    def _bind(self, kind: int, host: str, port: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(f"tcp://{host}:{port}")
        return sock

    def _send_config_once(self) -> None:
        """FlexKV's send blocks until a remote connects; here in slices, so close() can stop it."""
        self.command.setsockopt(zmq.SNDTIMEO, 50)
        while not self._closing.is_set():
            try:
                self.command.send_pyobj(self.config)
            except zmq.Again:
                continue
            self.config_sent.set()
            return

    def is_ready(self) -> bool:
        try:
            self.query.send_pyobj({"type": "query_ready"})
            return bool(self.query.recv_pyobj()["ready"])
        except zmq.Again:
            return False

    def submit(self, op_id: int) -> dict:
        self._sender.join()
        self.command.send_pyobj({"type": "submit", "graph": None, "task_end_op_id": op_id})
        self.result.setsockopt(zmq.RCVTIMEO, 2000)
        return self.result.recv_pyobj()

    def close(self) -> None:
        self._closing.set()
        self._sender.join()
        for sock in (self.command, self.result, self.query):
            sock.close()
        self._ctx.term()  # returns once the ports are unbound, so a restarted master can bind them


def register_gpus(gpu_register_port: str, count: int) -> None:
    """What each local rank's KVTPClient does: PUSH a registration to the node-local port."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(gpu_register_port)
    for rank in range(count):
        sock.send_pyobj({"dp_client_id": 0, "intra_client_id": rank, "device_id": rank, "handles": []})
    sock.close(linger=10000)  # a loaded machine can take seconds to connect
    ctx.term()
