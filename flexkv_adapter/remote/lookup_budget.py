"""One ``connect_timeout_s`` for all of start-up's name lookups, not one each.

Every lookup is bounded on its own (``config/lookup.py``), but start-up makes several in a row:
the master's name for the preflight, the lock key and the spawn check. A resolver that answers
each one just inside the bound would hold start-up for one bound per lookup before exit 10.
``health_host`` is another name, looked up with its own bound: a budget the master's lookups used up
would otherwise end in exit 9 ("cannot listen") for a health host that resolves.
The budget hands each step what the earlier ones left, and counts only the time
spent in those steps (importing FlexKV between them is no lookup).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class LookupBudget:
    """Seconds left for start-up's lookups; ``spend`` runs a step with them and charges its time."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self._spent_s = 0.0

    def left_s(self) -> float:
        return max(0.0, self.total_s - self._spent_s)

    def spend(self, step: Callable[[float], T]) -> T:
        """``step(seconds left)``; its time is charged whatever it returns or raises."""
        started = time.monotonic()
        try:
            return step(self.left_s())
        finally:
            self._spent_s += time.monotonic() - started
