"""Reap every descendant process, so no FlexKV worker outlives the remote."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from multiprocessing import resource_tracker  # now: a preflight thread may hold its import lock at exit
from pathlib import Path

logger = logging.getLogger(__name__)


def _proc_table() -> dict[int, list[int]]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    return parents


def descendants(pid: int | None = None) -> list[int]:
    """Pids of all live descendants of ``pid`` (default: this process), from /proc."""
    parents = _proc_table()
    found, todo = [], [os.getpid() if pid is None else pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ignores_sigterm(pid: int) -> bool:
    """True for processes that ignore SIGTERM (e.g. multiprocessing's resource tracker)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def workers_left() -> list[int]:
    """Live descendants that would answer SIGTERM (not the resource tracker)."""
    return [p for p in descendants() if not ignores_sigterm(p)]


def reap_descendants(grace_s: float) -> bool:
    """SIGTERM every descendant and give it ``grace_s`` to exit; SIGKILL the rest.

    Processes that ignore SIGTERM (multiprocessing's resource tracker) are not waited for; see
    :func:`end_children`. False if a process that handles SIGTERM had to be killed.
    """
    pids = workers_left()
    if not pids:
        return True
    logger.info("stopping child processes %s", pids)
    sent: set[int] = set()
    deadline = time.monotonic() + grace_s
    while True:
        _collect_zombies()
        patient = workers_left()
        for pid in set(patient) - sent:  # including any started meanwhile
            _kill(pid, signal.SIGTERM)
        sent.update(patient)
        if not patient or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for pid in patient:
        _kill(pid, signal.SIGKILL)
    while set(patient) & set(descendants()) and time.monotonic() < deadline + 5:
        _collect_zombies()
        time.sleep(0.02)
    _collect_zombies()
    if patient:
        logger.warning("killed child processes %s still running %gs after SIGTERM", patient, grace_s)
    return not patient


def end_children() -> None:
    """Last step before exit: close the resource tracker, SIGKILL anything still running."""
    _stop_resource_tracker()
    for pid in descendants():
        _kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while descendants() and time.monotonic() < deadline:
        _collect_zombies()
        time.sleep(0.02)
    _collect_zombies()


def _stop_resource_tracker() -> None:
    """End multiprocessing's resource tracker as it expects, by closing its pipe.

    It ignores SIGTERM; closed, it unlinks whatever the workers leaked and exits, where SIGKILL
    would leak those and make the next user relaunch it.
    """
    stop = getattr(getattr(resource_tracker, "_resource_tracker", None), "_stop", None)
    if callable(stop):  # in a thread: its lock may be held by a thread stuck inside FlexKV
        closer = threading.Thread(target=stop, name="resource-tracker-stop", daemon=True)
        closer.start()
        closer.join(2.0)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _collect_zombies() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
