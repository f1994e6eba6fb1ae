"""HTTP health endpoint: ``GET /`` -> JSON state snapshot, 200 only when ready, else 503.

Idle or slow clients cannot pin it: each connection has a read timeout, and connections beyond
``max_connections`` are closed at once instead of getting a thread.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .exit_codes import ExitCode, RemoteExit
from .states import State, StateTracker

logger = logging.getLogger(__name__)

CONNECTION_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 16


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the accept loop sheds excess connections fast; a short backlog stalls clients

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], family: int) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            logger.debug("health: %d connections open, closing one from %s", MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HealthServer:
    def __init__(self, tracker: StateTracker, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT_S

            def do_GET(self) -> None:
                snap = tracker.snapshot()
                body = json.dumps(snap).encode()
                self.send_response(200 if snap["state"] == State.READY.value else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("health: " + format, *args)

        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
            self._server = _BoundedServer((host, port), Handler, family)
        except OSError as exc:
            raise RemoteExit(
                ExitCode.HEALTH_ENDPOINT,
                f"health endpoint cannot listen on {host}:{port} ({exc.strerror or exc}); "
                f"choose another health_port/health_host",
            ) from None
        self.address = self._server.server_address
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    def start(self) -> None:
        self._thread.start()
        logger.info("health endpoint on http://%s:%d/", *self.address[:2])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
