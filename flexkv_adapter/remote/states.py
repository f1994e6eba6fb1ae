"""The remote's lifecycle states, logged on change and served on the health endpoint / ready file."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class State(str, Enum):
    WAITING_FOR_MASTER = "waiting_for_master"
    HANDSHAKE = "handshake"
    WAITING_FOR_GPUS = "waiting_for_gpus"
    READY = "ready"
    SHUTTING_DOWN = "shutting_down"
    FAILED = "failed"


class StateTracker:
    """Thread-safe current state; writes the ready file while READY."""

    def __init__(self, info: dict[str, Any], ready_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._state = State.WAITING_FOR_MASTER
        self._since = time.time()
        self._detail = ""
        self._info = info
        self._ready_file = ready_file
        logger.info("state: %s", self._state.value)

    @property
    def state(self) -> State:
        return self._state

    def set(self, state: State, detail: str = "") -> None:
        with self._lock:
            if state == self._state and detail == self._detail:
                return
            self._state, self._since, self._detail = state, time.time(), detail
        logger.info("state: %s%s", state.value, f" ({detail})" if detail else "")
        if self._ready_file is not None:
            if state is State.READY:
                tmp = self._ready_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.snapshot()))
                os.replace(tmp, self._ready_file)
            else:
                self._ready_file.unlink(missing_ok=True)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self._state.value,
                "since": self._since,
                "detail": self._detail,
                "pid": os.getpid(),
                **self._info,
            }


class HealthServer:
    """``GET /`` (any path) -> JSON snapshot; 200 only when READY, else 503."""

    def __init__(self, tracker: StateTracker, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
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

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.address = self._server.server_address
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    def start(self) -> None:
        self._thread.start()
        logger.info("health endpoint on http://%s:%d/", *self.address[:2])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
