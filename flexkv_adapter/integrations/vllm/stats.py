"""vLLM's connector stats from FlexKV's counters, per interval as vLLM's contract asks.

vLLM asks the scheduler-side connector, every step, for the stats "collected during the last interval"
(base.py:453-454; scheduler.py:2594) and its logger *sums* what it gets between two log lines
(metrics.py:65-91, through ``_FlexKVConnectorStats.aggregate``, adp:40-56). FlexKV hands back its
cumulative counters every step (adp:1247-1278), so each logged figure was a sum of running totals.
The plugin hands vLLM what was counted since the last ask. FlexKV zeroes its counters itself every
``FLEXKV_NUM_LOG_INTERVAL_REQUESTS`` gets (stats.py ``record_get`` -> ``clear``): what was counted
before such a clear is kept for the next ask, so nothing is lost or counted twice.

Across workers nothing changes: FlexKV's workers send an empty sentinel whose ``aggregate`` returns
the other side's stats (adp:66-83), vLLM's ``KVOutputAggregator`` folds the workers' sentinels, and
the scheduler folds its own stats in (scheduler.py:2589-2603) once per step, whatever the TP size.

The same counts also feed :class:`HitsLine`: an INFO line of FlexKV's hits and restored blocks at most every
``hits_log_interval_s``, so that a server shows FlexKV serving without vLLM's stats logger or a metrics stack.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...config.settings import load_settings
from ...errors import AdapterError

logger = logging.getLogger(__name__)

INTERVAL = "_flexkv_adapter_stats_interval"
HITS = "_flexkv_adapter_hits_line"
# FlexKVStats' counters at 34ab141 (flexkv/integration/stats.py), the keys of adp:1266-1277
COUNTERS = (
    "num_get_requests",
    "num_get_query_tokens",
    "num_gpu_matched_tokens",
    "num_flexkv_matched_tokens",
    "num_put_requests",
    "num_put_query_tokens",
    "num_put_unmatched_tokens",
    "num_failed_requests",
)


@dataclass
class Interval:
    """What FlexKV's counters held at the last ask, and what a clear since then took from them."""

    last: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    carry: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))

    def fold(self, stats: Any) -> None:
        """Before FlexKV zeroes its counters: keep what they gained since the last ask."""
        for key in COUNTERS:
            self.carry[key] += int(getattr(stats, key)) - self.last[key]
            self.last[key] = 0

    def take(self, stats: Any) -> dict[str, int | float]:
        """The counts since the last ask, with FlexKV's two ratios over them (adp:1275-1276)."""
        data: dict[str, int | float] = {}
        for key in COUNTERS:
            now = int(getattr(stats, key))
            data[key] = self.carry[key] + now - self.last[key]
            self.last[key], self.carry[key] = now, 0
        query = data["num_get_query_tokens"]
        data["get_gpu_match_ratio"] = data["num_gpu_matched_tokens"] / query if query else 0.0
        data["get_flexkv_match_ratio"] = data["num_flexkv_matched_tokens"] / query if query else 0.0
        return data


@dataclass
class HitsLine:
    """FlexKV's counts summed between INFO lines, one at most every ``interval_s`` (0: none) and only after
    something was counted: a quiet server logs nothing. Restored blocks are FlexKV's matched tokens over its
    block size (vLLM loads whole blocks); a load that then fails is counted in ``failed``."""

    interval_s: float
    block_size: int | None = None
    clock: Callable[[], float] = time.monotonic
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    since: float = field(init=False)

    def __post_init__(self) -> None:
        self.since = self.clock()

    def add(self, data: dict[str, int | float]) -> None:
        """One interval's counts (:meth:`Interval.take`); the line when ``interval_s`` has passed since the last."""
        if self.interval_s <= 0:
            return
        for key in COUNTERS:
            self.sums[key] += int(data[key])
        now = self.clock()
        if now - self.since < self.interval_s:
            return
        if any(self.sums.values()):
            logger.info("%s", self.line(now - self.since))
        self.since, self.sums = now, dict.fromkeys(COUNTERS, 0)

    def line(self, seconds: float) -> str:
        s = self.sums
        hit, query = s["num_flexkv_matched_tokens"], s["num_get_query_tokens"]
        blocks = f"{hit // self.block_size} blocks of {self.block_size} tokens" if self.block_size else f"{hit} tokens"
        return (
            f"flexkv_adapter: FlexKV in the last {seconds:.0f} s: {hit} of {query} prompt tokens hit "
            f"({100 * hit / query if query else 0.0:.1f}%), {blocks} restored; {s['num_get_requests']} lookups, "
            f"{s['num_gpu_matched_tokens']} tokens already on the GPU, {s['num_put_requests']} stores, "
            f"{s['num_failed_requests']} failed"
        )


def attach(conn: Any, clock: Callable[[], float] = time.monotonic) -> None:
    """Scheduler side: start an interval at FlexKV's counters and keep what its own clears take."""
    impl = conn._flexkv_connector
    if impl.role.name != "SCHEDULER":
        return
    stats: Any = getattr(impl.connector, "flexkv_stats", None)
    missing = [k for k in COUNTERS if not hasattr(stats, k)]
    if missing:
        raise AdapterError(
            f"flexkv_adapter: FlexKV's scheduler-side stats lack {', '.join(missing)} (FlexKV 34ab141 has them); "
            f"vLLM would log figures the plugin cannot make per interval, so it refuses"
        )
    interval = Interval()
    block_size = getattr(impl.connector, "block_size", None)
    hits = HitsLine(load_settings().hits_log_interval_s, block_size if type(block_size) is int else None, clock)
    setattr(conn, HITS, hits)  # set before the first ask: what construction counted is not logged either
    interval.take(stats)  # counted before construction ended is not this connector's interval
    clear = getattr(stats, "clear", None)
    if callable(clear):  # FlexKV 34ab141 has it; a FlexKV without it never zeroes its counters

        @functools.wraps(clear)
        def folded_clear() -> Any:
            interval.fold(stats)
            return clear()

        stats.clear = folded_clear  # FlexKV calls self.clear() from record_get: the instance attribute answers
    setattr(conn, INTERVAL, interval)


def wrap(original: Any) -> Any:
    """vLLM's ``FlexKVConnectorV1.get_kv_connector_stats``, answering with the last interval's counts."""

    @functools.wraps(original)
    def get_kv_connector_stats(self: Any) -> Any:
        stats = original(self)
        interval = getattr(self, INTERVAL, None)
        if stats is None or interval is None:  # worker side: FlexKV's sentinel; no vLLM stats type: None
            return stats
        data = interval.take(self._flexkv_connector.connector.flexkv_stats)
        hits = getattr(self, HITS, None)
        if hits is not None:
            hits.add(data)
        return type(stats)(data=data)

    return get_kv_connector_stats


__all__ = ["COUNTERS", "HITS", "INTERVAL", "HitsLine", "Interval", "attach", "wrap"]
