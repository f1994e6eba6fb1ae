"""``start_remote``: command line, settings, and the end-to-end run with cleanup."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from ..config.lookup import LookupTimedOut
from ..config.settings import AdapterSettings, load_settings
from ..errors import SettingsError
from .args import build_parser, overrides
from .children import end_children, reap_descendants
from .dryrun import dry_run as run_dry
from .dryrun import plan
from .exit_codes import ExitCode, RemoteExit
from .health import HealthServer
from .lock import InstanceLock, prepare_lock_dir
from .lookup_budget import LookupBudget
from .output import flush_all, guard_streams
from .preflight import (
    StopRequested,
    apply_gpu_visibility,
    load_transfer_manager,
    unresolved_master,
    validate,
    wait_for_master,
)
from .spawns import classify_spawns
from .states import ReadyFile, State, StateTracker
from .supervisor import Signals, Supervisor

logger = logging.getLogger("flexkv_adapter.remote")
T = TypeVar("T")


def _unless_stopped(step: Callable[[], T], signals: Signals) -> T:
    """Run a step that can block for long (a name lookup, bounded by connect_timeout_s; importing FlexKV
    and torch) in a thread, so a stop signal ends start-up within grace_s; the abandoned thread ends
    with the process (os._exit)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, step()))
        except BaseException as exc:
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="preflight", daemon=True)
    worker.start()
    while worker.is_alive():
        if signals.event.is_set():
            raise StopRequested
        worker.join(0.05)
    ok, value = outcome[0]
    if not ok:
        raise value
    return cast(T, value)


def run_remote(s: AdapterSettings, dry_run: bool = False, signals: Signals | None = None) -> ExitCode:
    """Everything after settings are loaded; always cleans up (lock, its own ready file, children)."""
    signals = signals or Signals()
    lock: InstanceLock | None = None
    tracker: StateTracker | None = None
    health: HealthServer | None = None
    ready_file = ReadyFile(s.ready_file) if s.ready_file else None
    code = ExitCode.FORCED
    failure: RemoteExit | None = None
    lookups = LookupBudget(s.connect_timeout_s)  # start-up's name lookups share one connect_timeout_s
    try:
        lookups.spend(lambda _: _unless_stopped(lambda: validate(s), signals))  # resolves master_host (first)
        if dry_run:
            code = _unless_stopped(lambda: run_dry(s), signals)
            return code
        lock_dir = prepare_lock_dir(s.lock_dir)
        if ready_file is not None:
            ready_file.check()  # fails now rather than when ready
        visibility = apply_gpu_visibility(s.keep_cuda_visible_devices)
        tm_class = _unless_stopped(lambda: load_transfer_manager(s.transfer_manager), signals)
        assert s.master_host is not None
        host, ports = s.master_host, s.master_ports
        lock = lookups.spend(lambda left: _unless_stopped(lambda: InstanceLock(lock_dir, host, ports, left), signals))
        lock.acquire()
        lookups.spend(lambda left: _unless_stopped(lambda: _refuse_spawns(s, left), signals))
        if ready_file is not None:
            ready_file.claim()  # under the lock: another live remote's file is refused, a dead one's removed
        tracker = StateTracker({"master": f"{s.master_host}:{s.master_ports[0]}", "node_rank": s.node_rank}, ready_file)
        signals.describe = tracker.snapshot
        if s.health_port:
            health_port = s.health_port
            # health_host is not the master's name: its own bound, so a slow master lookup is never exit 9
            health = _unless_stopped(
                lambda: HealthServer(tracker, s.health_host, health_port, s.connect_timeout_s), signals
            )
            health.start()
        logger.debug("plan: %s", plan(s, visibility, lock))
        wait_for_master(s, signals.wait)
        code = Supervisor(s, tm_class, tracker, signals).run()
    except StopRequested:
        logger.info("stopped before connecting to the master")
        code = ExitCode.OK
    except (RemoteExit, LookupTimedOut) as exc:
        if isinstance(exc, LookupTimedOut):  # a later lookup of the master (lock, spawns, dry run)
            exc = unresolved_master(s, exc)
        failure, code = exc, exc.code
        if tracker is not None:
            tracker.set(State.FAILED, str(exc))
            if health is not None and s.failed_visible_s > 0 and not signals.event.is_set():
                logger.info("serving state failed for failed_visible_s=%g s for the engine", s.failed_visible_s)
                signals.wait(s.failed_visible_s)  # a stop signal cuts it short
    finally:
        if health is not None:
            health.stop()
        if ready_file is not None and tracker is not None:
            ready_file.remove()
        reap_descendants(0.0 if code is ExitCode.FORCED else min(s.reap_grace_s, s.grace_s))
        if lock is not None:
            lock.release()
    if failure is not None:  # after the failed_visible_s window and the teardown: the last line says why
        logger.error("%s", failure)
    return code


def _refuse_spawns(s: AdapterSettings, lookup_s: float | None = None) -> None:
    assert s.master_host is not None
    budget = s.connect_timeout_s if lookup_s is None else lookup_s  # start-up's share of connect_timeout_s
    refused, others = classify_spawns(s.master_host, s.master_ports, budget)
    for spawn in others:
        logger.warning("FlexKV's engine spawned a remote for another master on this node: %s", spawn.describe())
    if refused:
        raise RemoteExit(
            ExitCode.ALREADY_RUNNING,
            f"FlexKV's engine already spawned a remote on this node for this master, or for one its sockets "
            f"do not tell ({'; '.join(x.describe() for x in refused)}); two remotes on one master split its "
            f"commands. Stop one of them, or wait until that spawn connects to its own master",
        )


def main(argv: Sequence[str] | None = None, prog: str = "start_remote.py") -> int:
    guard_streams()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s start_remote: %(message)s")
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exc:  # --help (0) or a command-line error (2, logged by the parser)
        return exc.code if isinstance(exc.code, int) else ExitCode.SETTINGS
    if args.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    signals = Signals()
    signals.install()  # before anything slow, so SIGTERM is handled in every state
    try:
        s = load_settings(args.config, **overrides(args))
    except SettingsError as exc:
        logger.error("%s", str(exc).replace(":\n  ", ": ").replace("\n  ", "; "))
        return ExitCode.BAD_PORTS if "master_ports" in exc.keys else ExitCode.SETTINGS
    except Exception as exc:  # a malformed YAML file, an unreadable one
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        logger.error("cannot load settings (config %s): %s", args.config or "$FLEXKV_ADAPTER_CONFIG", why)
        return ExitCode.SETTINGS
    return int(run_remote(s, args.dry_run, signals))


def entry_point(argv: Sequence[str] | None = None, prog: str = "start_remote.py") -> None:
    """Exit without waiting for threads blocked inside FlexKV (they have no timeouts)."""
    code = main(argv, prog)
    end_children()
    logging.shutdown()
    flush_all()  # a closed or unread stdout/stderr must not change the status
    os._exit(code)
