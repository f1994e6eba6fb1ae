"""Run a call that may block (a hanging resolver, a trickling peer) in a thread with a wall-clock limit."""

from __future__ import annotations

import threading
from collections.abc import Callable


def in_thread(call: Callable[[], object], limit_s: float) -> tuple[bool, object]:
    """(finished within ``limit_s``, what ``call`` returned or raised; None if it did not finish)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit_s)
    return not worker.is_alive(), out[0] if out else None


def outcome_within(call: Callable[[], object], limit_s: float, what: str) -> object:
    """What ``call`` returned or raised; an AssertionError naming ``what`` if it outlives ``limit_s``."""
    finished, outcome = in_thread(call, limit_s)
    assert finished, f"still blocked after {limit_s} s: {what}"
    return outcome
