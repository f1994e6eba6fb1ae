"""Run the transfer manager in-process, with deadlines, signals, a watchdog, and no orphans.

FlexKV's ``TransferManagerOnRemote(master_host, master_ports)`` blocks in its constructor until the
master sends its config, and ``start()`` waits for every local GPU rank to register; neither wait
has a timeout. The manager therefore runs in a daemon thread while the main thread watches the
phase it is in, enforces a deadline on each, handles signals, and after ``ready`` probes the
master so that a dead master ends the remote (FlexKV has no heartbeat).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, NoReturn

from ..settings import AdapterSettings
from .exit_codes import ExitCode, RemoteExit
from .preflight import unreachable_ports
from .states import State, StateTracker

logger = logging.getLogger(__name__)
_TICK = 0.05


class Signals:
    """Counts SIGTERM/SIGINT; the first asks for a clean shutdown, the second forces exit."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        logger.info("received %s (%d)", signal.Signals(signum).name, self.count)
        self.event.set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if a signal has arrived."""
        return self.event.wait(seconds)


def _is_ready(tm: Any) -> bool:
    check = getattr(tm, "is_ready", None)
    return bool(check()) if callable(check) else bool(getattr(tm, "_is_ready", False))


class Supervisor:
    """Drives one transfer manager through handshake, GPU registration, ready and shutdown."""

    def __init__(self, settings: AdapterSettings, tm_class: type, tracker: StateTracker, signals: Signals) -> None:
        self.s = settings
        self.tm_class = tm_class
        self.tracker = tracker
        self.signals = signals
        self.tm: Any = None
        self.error: BaseException | None = None

    def _body(self) -> None:
        try:
            ports = tuple(str(p) for p in self.s.master_ports)  # FlexKV's ModelConfig keeps them as strings
            self.tm = self.tm_class(master_host=self.s.master_host, master_ports=ports)
            self.tracker.set(State.WAITING_FOR_GPUS, "config received; waiting for local GPU ranks to register")
            self.tm.start()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def run(self) -> ExitCode:
        self.tracker.set(State.HANDSHAKE, f"waiting for the config from {self.s.master_host}")
        threading.Thread(target=self._body, name="transfer-manager", daemon=True).start()
        seen, phase_start = State.HANDSHAKE, time.monotonic()
        last_seen = next_probe = 0.0
        while True:
            if self.signals.wait(_TICK):
                return self.shutdown("signal", signals_seen=1)
            now, state = time.monotonic(), self.tracker.state
            if state is not seen:
                seen, phase_start = state, now
            if self.error is not None:
                raise RemoteExit(ExitCode.CRASHED, f"transfer manager failed in {state.value}: {self.error!r}")
            if state is State.HANDSHAKE and now - phase_start > self.s.handshake_timeout_s:
                raise RemoteExit(
                    ExitCode.HANDSHAKE_TIMEOUT,
                    f"timed out in handshake: no config from master {self.s.master_host}:"
                    f"{self.s.master_ports[0]} within {self.s.handshake_timeout_s:g}s; is node 0's "
                    f"FlexKV configured for this many nodes, and is only one remote connected?",
                )
            if state is State.WAITING_FOR_GPUS:
                if _is_ready(self.tm):
                    self.tracker.set(State.READY, "transfer engine initialised")
                    last_seen = next_probe = now
                elif now - phase_start > self.s.gpu_timeout_s:
                    self._give_up(
                        "gpu registration timeout",
                        ExitCode.GPU_TIMEOUT,
                        f"timed out in waiting_for_gpus: local GPU ranks did not register with "
                        f"{self.s.server_recv_port}_gpu_register within {self.s.gpu_timeout_s:g}s; "
                        f"check that every rank on this node started and that FLEXKV_SERVER_RECV_PORT "
                        f"matches node 0",
                    )
            if state is State.READY and now >= next_probe:
                next_probe = now + self.s.probe_interval_s
                assert self.s.master_host is not None
                failed = unreachable_ports(self.s.master_host, self.s.master_ports[:1], timeout=1.0)
                if not failed:
                    last_seen = now
                elif now - last_seen > self.s.master_lost_s:
                    self._give_up(
                        "master lost",
                        ExitCode.MASTER_LOST,
                        f"master {self.s.master_host} unreachable for {now - last_seen:.1f}s "
                        f"(> master_lost_s={self.s.master_lost_s:g}); exiting so the supervisor "
                        f"restarts the remote",
                    )
                else:
                    logger.warning("master %s unreachable (%s)", self.s.master_host, next(iter(failed.values())))

    def _give_up(self, reason: str, code: ExitCode, message: str) -> NoReturn:
        """Shut the running manager down (within grace_s), then end with ``code``."""
        self.shutdown(reason, code)
        raise RemoteExit(code, message)

    def shutdown(self, reason: str, exit_code: ExitCode = ExitCode.OK, signals_seen: int | None = None) -> ExitCode:
        """Shut the manager down within ``grace_s``; another signal or the deadline forces exit.

        ``signals_seen`` is how many signals this shutdown already answers (1 when a signal
        started it), so a second one arriving at any time after it forces exit.
        """
        signals_before = self.signals.count if signals_seen is None else signals_seen
        self.tracker.set(State.SHUTTING_DOWN, reason)
        stop = getattr(self.tm, "shutdown", None)
        if not callable(stop):
            return exit_code
        worker = threading.Thread(target=stop, name="shutdown", daemon=True)
        worker.start()
        deadline = time.monotonic() + self.s.grace_s
        while worker.is_alive():
            if self.signals.count > signals_before:
                logger.warning("another signal during shutdown: forcing exit")
                return ExitCode.FORCED
            if time.monotonic() > deadline:
                logger.warning("transfer manager did not shut down within grace_s=%gs: forcing exit", self.s.grace_s)
                return ExitCode.FORCED
            worker.join(_TICK)
        logger.info("transfer manager shut down")
        return exit_code
