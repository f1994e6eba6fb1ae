"""SGLang: an INFO line of FlexKV's hits and restored blocks, at most one every ``hits_log_interval_s``.

SGLang keeps no FlexKV counters of its own (FlexKV's vLLM adapter has ``FlexKVStats``; its SGLang connector
logs each lookup only at DEBUG), so an operator could not tell on a real server whether FlexKV serves
anything. The plugin's radix hooks count what each match found in FlexKV and what each load restored (after
the bridge's own rules: a load that is a miss counts as failed, not restored), and the leader logs the sums
once per interval, only when something was counted. No timer thread: the line comes with the first lookup
after the interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ...config.settings import load_settings

logger = logging.getLogger(__name__)
FIELDS = ("lookups", "hits", "query_tokens", "hit_tokens", "loads", "restored_tokens", "failed_loads")


class HitsLog:
    """The counts since the last line, which :meth:`lookup` logs when it is due (plain int slots, not a dict: the
    hooks count on every match and load)."""

    __slots__ = ("clock", "failed_loads", "hit_tokens", "hits", "interval_s", "loads", "lookups", "page_size",
                 "query_tokens", "restored_tokens", "since")  # fmt: skip
    lookups: int
    hits: int
    query_tokens: int
    hit_tokens: int
    loads: int
    restored_tokens: int
    failed_loads: int

    def __init__(self, interval_s: float, page_size: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.interval_s, self.page_size, self.clock = interval_s, page_size, clock
        self.since = clock()
        self._zero()

    def _zero(self) -> None:
        self.lookups = self.hits = self.query_tokens = self.hit_tokens = 0
        self.loads = self.restored_tokens = self.failed_loads = 0

    @property
    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIELDS}

    def lookup(self, query_tokens: int, hit_tokens: int) -> None:
        """A request's lookup; the line first, when due, so that each line holds whole requests (lookup and load)."""
        now = self.clock()
        if now - self.since >= self.interval_s:  # inline: every lookup asks
            self._maybe_log(now)
        self.lookups += 1
        self.query_tokens += query_tokens
        if hit_tokens > 0:
            self.hits += 1
            self.hit_tokens += hit_tokens

    def load(self, asked: int, loaded: int) -> None:
        self.loads += 1
        self.restored_tokens += loaded
        self.failed_loads += asked > 0 and loaded < asked

    def _maybe_log(self, now: float) -> None:
        """The line, at ``now`` (the interval has passed), unless nothing was counted or the line is off."""
        if self.interval_s <= 0:
            return
        if any(self.counts.values()):
            logger.info("%s", self.line(now - self.since))
        self.since = now
        self._zero()

    def line(self, seconds: float) -> str:
        c = self.counts
        hit, query, restored = c["hit_tokens"], c["query_tokens"], c["restored_tokens"]
        blocks = (
            f"{restored // self.page_size} blocks of {self.page_size} tokens"
            if self.page_size
            else f"{restored} tokens"
        )
        return (
            f"flexkv_adapter: FlexKV in the last {seconds:.0f} s: {hit} of {query} prompt tokens hit "
            f"({100 * hit / query if query else 0.0:.1f}%), {blocks} restored; {c['lookups']} lookups "
            f"({c['hits']} hits), {c['loads']} loads, {c['failed_loads']} failed"
        )


def attach(bridge: Any, clock: Callable[[], float] = time.monotonic) -> HitsLog | None:
    """Give ``bridge`` a :class:`HitsLog` (``bridge.hits_log``) on the TP leader, which the plugin's radix hooks feed
    (:mod:`.lookups` after each match, :mod:`.flush` after each load: no call of the bridge's own is wrapped, so
    the bridge's per-request cost is unchanged); None where nothing is logged: another rank (it would repeat the
    leader's line) or ``hits_log_interval_s`` 0."""
    interval = load_settings().hits_log_interval_s
    hits = None
    if interval > 0 and getattr(bridge, "leader", True):
        page_size = getattr(getattr(bridge, "connector", None), "page_size", None)
        hits = HitsLog(interval, page_size if type(page_size) is int and page_size > 0 else None, clock)
    bridge.hits_log = hits
    return hits


__all__ = ["HitsLog", "attach"]
