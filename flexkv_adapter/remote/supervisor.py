"""Run the transfer manager in-process, with phase deadlines, signals, a watchdog, and no orphans.

FlexKV's ``TransferManagerOnRemote(master_host, master_ports)`` blocks in its constructor until the
master's one config message arrives; ``start()`` waits for every local GPU rank to register, then
allocates the CPU cache and spawns workers. None of these waits has a timeout. The manager runs in
a daemon thread while the main thread reads its phase from the manager's attributes, enforces a
deadline per phase, handles signals, and from the config on watches the master (FlexKV has no
heartbeat and never re-handshakes). Shutdown never calls the manager's ``shutdown()``
(see ``teardown``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ..config.settings import AdapterSettings
from .exit_codes import ExitCode, RemoteExit
from .preflight import StopRequested
from .states import State, StateTracker
from .teardown import stop_manager
from .watch import MasterWatch

logger = logging.getLogger(__name__)
_TICK = 0.05


class Signals:
    """SIGTERM/SIGINT/SIGHUP ask for a clean shutdown, a second one forces exit; SIGUSR1/2 log the state."""

    STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    STATUS = (signal.SIGUSR1, signal.SIGUSR2)

    def __init__(self) -> None:
        self.event = threading.Event()
        self.count = 0
        self.describe: Callable[[], object] | None = None

    def install(self) -> None:
        for sig in self.STOP:
            signal.signal(sig, self._handle)
        for sig in self.STATUS:
            signal.signal(sig, self._status)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        logger.info("received %s (%d)", signal.Signals(signum).name, self.count)
        self.event.set()

    def _status(self, signum: int, frame: Any) -> None:
        logger.info("received %s: %s", signal.Signals(signum).name, self.describe() if self.describe else "starting")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if a stop signal has arrived."""
        return self.event.wait(seconds)


class Supervisor:
    """Drives one transfer manager through handshake, GPU registration, engine start, ready, shutdown."""

    def __init__(self, settings: AdapterSettings, tm_class: type, tracker: StateTracker, signals: Signals) -> None:
        self.s = settings
        self.tm_class = tm_class
        self.tracker = tracker
        self.signals = signals
        self.tm: Any = None
        self.started = False  # start() returned
        self.error: BaseException | None = None
        self._entered = time.monotonic()
        self._watch: MasterWatch | None = None

    def _body(self) -> None:
        # FlexKV's workers (and multiprocessing's resource tracker) handle SIGTERM and ignore SIGINT
        # but die of SIGHUP (a closed terminal sends it to the whole process group) and of the
        # status signals. They are spawned from this thread and inherit its signal mask: with these
        # blocked, only the main thread gets them, and the workers stop (and unpin) through the
        # normal shutdown, or keep running.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, *Signals.STATUS})
        try:
            ports = tuple(str(p) for p in self.s.master_ports)  # FlexKV's ModelConfig keeps them as strings
            self.tm = self.tm_class(master_host=self.s.master_host, master_ports=ports)
            self.tm.start()
            self.started = True
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _move(self, state: State, detail: str) -> None:
        if self.tracker.set(state, detail):
            self._entered = time.monotonic()

    def _registered(self) -> str:
        return f"{len(getattr(self.tm, 'all_gpu_blocks', ()))}/{getattr(self.tm, 'expected_gpus', '?')}"

    def _observe(self) -> None:
        """Read the manager's phase: constructed, all GPUs registered, start() returned."""
        if self.tm is None:
            return
        self._move(State.WAITING_FOR_GPUS, f"config received; {self.register_port()} bound; waiting for GPU ranks")
        expected = getattr(self.tm, "expected_gpus", None)
        if isinstance(expected, int) and len(getattr(self.tm, "all_gpu_blocks", ())) >= expected:
            self._move(
                State.STARTING_ENGINE, f"{self._registered()} GPU ranks registered; starting the transfer engine"
            )
        if self.started and getattr(self.tm, "_is_ready", True):
            self._move(State.READY, "transfer engine started")

    def register_port(self) -> str:
        """The register port FlexKV bound: the one in the master's config, not the local setting."""
        return str(getattr(self.tm, "gpu_register_port", None) or f"{self.s.server_recv_port}_gpu_register")

    def run(self) -> ExitCode:
        if self.signals.event.is_set():  # never connect after a stop signal: the config is sent once
            raise StopRequested
        self._move(State.HANDSHAKE, f"waiting for the config from {self.s.master_host}:{self.s.master_ports[0]}")
        threading.Thread(target=self._body, name="transfer-manager", daemon=True).start()
        while True:
            if self.signals.wait(_TICK):
                return self.shutdown("signal")
            self._observe()
            if self.error is not None:
                self._give_up(
                    ExitCode.CRASHED, f"transfer manager failed in {self.tracker.state.value}: {self.error!r}"
                )
            self._check_deadline(self.tracker.state, time.monotonic() - self._entered)
            if self.tm is not None:  # the config is bound to the master that sent it
                self._check_master()

    def _check_deadline(self, state: State, elapsed: float) -> None:
        s = self.s
        if state is State.HANDSHAKE and elapsed > s.handshake_timeout_s:
            self._give_up(
                ExitCode.HANDSHAKE_TIMEOUT,
                f"timed out in handshake: no config from master {s.master_host}:{s.master_ports[0]} within "
                f"{s.handshake_timeout_s:g}s. FlexKV's master sends its config once, when node 0's engine "
                f"starts: if an earlier remote already received it, or node 0 is not running multi-node "
                f"FlexKV for this many nodes, restart node 0's engine (then this remote)",
            )
        if state is State.WAITING_FOR_GPUS and elapsed > s.gpu_timeout_s:
            self._give_up(
                ExitCode.GPU_TIMEOUT,
                f"timed out in waiting_for_gpus: {self._registered()} local GPU ranks registered with "
                f"{self.register_port()} (bound from the master's config) within {s.gpu_timeout_s:g}s; check "
                f"that every rank on this node started and registers there (local setting: "
                f"{s.server_recv_port}_gpu_register; FLEXKV_SERVER_RECV_PORT must match node 0)",
            )
        if state is State.STARTING_ENGINE and elapsed > s.engine_timeout_s:
            self._give_up(
                ExitCode.ENGINE_TIMEOUT,
                f"timed out in starting_engine: the transfer engine (CPU cache allocation and pinning, "
                f"worker processes) did not start within engine_timeout_s={s.engine_timeout_s:g}s",
            )

    def _check_master(self) -> None:
        if self._watch is None:
            assert self.s.master_host is not None
            self._watch = MasterWatch(
                self.s.master_host, self.s.master_ports[1], self.s.probe_interval_s, self.s.master_lost_s
            )
        why = self._watch.lost()
        if why:
            self._give_up(
                ExitCode.MASTER_LOST,
                f"lost master {self.s.master_host} in {self.tracker.state.value}: {why}. FlexKV never "
                f"re-handshakes, so this remote cannot serve a restarted master; exiting so it restarts "
                f"once node 0's engine is up again",
            )

    def _give_up(self, code: ExitCode, message: str) -> NoReturn:
        """Stop the manager (within grace_s), then end with ``code``."""
        self.shutdown(code.name.lower().replace("_", " "))
        raise RemoteExit(code, message)

    def shutdown(self, reason: str) -> ExitCode:
        """Stop the manager and its children by ``grace_s``; another signal forces exit at once."""
        signals_before = self.signals.count
        self.tracker.set(State.SHUTTING_DOWN, reason)
        margin = min(1.0, self.s.grace_s / 10)  # for the steps after this one
        deadline = time.monotonic() + self.s.grace_s - margin
        result: list[bool] = []
        stopper = threading.Thread(
            target=lambda: result.append(stop_manager(self.tm, self.started, deadline, self.s.reap_grace_s)),
            name="shutdown",
            daemon=True,
        )
        stopper.start()
        while stopper.is_alive():
            if self.signals.count > signals_before:
                logger.warning("another signal during shutdown: forcing exit")
                return ExitCode.FORCED
            if time.monotonic() > deadline + margin / 2:
                logger.warning("shutdown did not finish within grace_s=%gs: forcing exit", self.s.grace_s)
                return ExitCode.FORCED
            stopper.join(_TICK)
        if not (result and result[0]):
            logger.warning("child processes had to be killed to end within grace_s=%gs", self.s.grace_s)
            return ExitCode.FORCED
        logger.info("transfer manager stopped")
        return ExitCode.OK
