"""HTTP health endpoint: ``GET /`` -> JSON state snapshot, 200 only when ready, else 503.

Idle or slow clients cannot pin it: each connection has a read timeout and a total deadline (a
client trickling one byte per second never hits the read timeout), connections beyond
``MAX_CONNECTIONS`` are closed at once instead of getting a thread, and a client that resets or
sends nonsense costs a debug line, not a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..config import lookup
from .exit_codes import ExitCode, RemoteExit
from .states import State, StateTracker

logger = logging.getLogger(__name__)

CONNECTION_TIMEOUT_S = 2.0  # per read
REQUEST_DEADLINE_S = 5.0  # per connection, however the bytes trickle in
MAX_CONNECTIONS = 16


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the accept loop sheds excess connections fast; a short backlog stalls clients

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], family: int) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._deadlines: dict[socket.socket, float] = {}
        self._deadlines_lock = threading.Lock()
        self._closed = threading.Event()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        """Bind without HTTPServer's ``getfqdn()``: a DNS lookup on the main thread delays signals."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            logger.debug("health: %d connections open, closing one from %s", MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        with self._deadlines_lock:
            self._deadlines[request] = time.monotonic() + REQUEST_DEADLINE_S
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: socket.socket) -> None:
        with self._deadlines_lock:
            self._deadlines.pop(request, None)
        self._slots.release()

    def cut_overdue(self) -> None:
        """Until closed: shut down connections past their deadline (their handler then ends)."""
        while not self._closed.wait(0.2):
            now = time.monotonic()
            with self._deadlines_lock:
                overdue = [sock for sock, deadline in self._deadlines.items() if deadline < now]
            for sock in overdue:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("health: client %s: %r", client_address, sys.exc_info()[1])  # a reset, a timeout

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()


class HealthServer:
    def __init__(self, tracker: StateTracker, host: str, port: int, lookup_s: float = 5.0) -> None:
        """``host`` is looked up once, within ``lookup_s``, and the address bound (``bind`` would look it up
        again, with no bound)."""

        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT_S

            def do_GET(self, with_body: bool = True) -> None:
                snap = tracker.snapshot()
                body = json.dumps(snap).encode()
                self.send_response(200 if snap["state"] == State.READY.value else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.do_GET(with_body=False)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("health: " + format, *args)

        try:
            family, _, _, _, sockaddr = lookup.getaddrinfo(host, port, lookup_s)[0]
            self._server = _BoundedServer((str(sockaddr[0]), port), Handler, family)
        except (OSError, UnicodeError, ValueError, lookup.LookupTimedOut) as exc:  # a label over 63 bytes
            raise RemoteExit(
                ExitCode.HEALTH_ENDPOINT,
                f"health endpoint cannot listen on {host}:{port} ({getattr(exc, 'strerror', None) or exc}); "
                f"choose another health_port/health_host",
            ) from None
        self.address = self._server.server_address
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)
        self._cutter = threading.Thread(target=self._server.cut_overdue, name="health-deadlines", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._cutter.start()
        logger.info("health endpoint on http://%s:%d/", *self.address[:2])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
