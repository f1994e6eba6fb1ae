"""Reap every descendant process, so no FlexKV worker outlives the remote."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def descendants(pid: int | None = None) -> list[int]:
    """Pids of all live descendants of ``pid`` (default: this process), from /proc."""
    root = os.getpid() if pid is None else pid
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
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap_descendants(grace_s: float = 2.0) -> list[int]:
    """SIGTERM every descendant, SIGKILL those still alive after ``grace_s``; return the pids."""
    pids = descendants()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p in descendants() for p in alive):
            _collect_zombies()
            time.sleep(0.05)
        _collect_zombies()
    if pids:
        logger.info("reaped child processes %s", pids)
    return pids


def _collect_zombies() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
