"""After ready: notice, once and for good, that the master that configured this remote is gone.

FlexKV sends its config once and never re-handshakes, so a remote that outlives its master is
stale for ever: it would answer ``ready`` to a restarted master that never configured it. The
watch keeps its own idle PUSH connection to the master's result port (a PULL there only reads
from peers that send, so this peer changes nothing) with ZMTP heartbeats. The connection drops
when the master's process ends or restarts, or when heartbeats go unanswered for
``master_lost_s``; either is final.

Connected means the ZMTP handshake finished, not the TCP connect: heartbeats only run after
the handshake, so a link cut between the two would otherwise leave a connection that nobody
probes until libzmq's 30 s handshake timeout. The handshake is bounded by ``master_lost_s`` too.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


class MasterWatch:
    def __init__(self, host: str, port: int, interval_s: float, lost_s: float) -> None:
        import zmq  # FlexKV's own dependency

        self._zmq = zmq
        self._ctx = zmq.Context(1)
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(interval_s * 1000)))
            self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(lost_s * 1000)))
        except zmq.ZMQError as exc:  # libzmq < 4.2: only a closed connection is noticed
            logger.warning("no ZMTP heartbeats (%s): a silent network loss will not be noticed", exc)
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(lost_s * 1000)))
        # the handshake event is stable from libzmq 4.3; before, a TCP connect is all that is reported
        self._up = zmq.EVENT_HANDSHAKE_SUCCEEDED if zmq.zmq_version_info() >= (4, 3) else zmq.EVENT_CONNECTED
        events = self._up | zmq.EVENT_DISCONNECTED
        self._monitor: Any = self._sock.get_monitor_socket(events)
        self._where = f"{host}:{port}"
        self._sock.connect(f"tcp://{self._where}")
        self._started = time.monotonic()
        self._lost_s = lost_s
        self._connected = False

    def lost(self) -> str | None:
        """Why the master counts as lost, or None while its first connection stands."""
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == self._up and not self._connected:
                self._connected = True
                logger.info("watching master %s: connected (from now on its loss ends this remote)", self._where)
            elif event == self._zmq.EVENT_DISCONNECTED and self._connected:
                return "its connection closed (the master process ended or restarted, or heartbeats went unanswered)"
        if not self._connected and time.monotonic() - self._started > self._lost_s:
            return f"no connection to it (ZMTP handshake done) within master_lost_s={self._lost_s:g}s"
        return None
