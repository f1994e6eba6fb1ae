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
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

from ...errors import AdapterError

logger = logging.getLogger(__name__)

INTERVAL = "_flexkv_adapter_stats_interval"
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


def attach(conn: Any) -> None:
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
        return type(stats)(data=interval.take(self._flexkv_connector.connector.flexkv_stats))

    return get_kv_connector_stats


__all__ = ["COUNTERS", "INTERVAL", "Interval", "attach", "wrap"]
