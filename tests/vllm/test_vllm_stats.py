"""Connector stats through vLLM's real Scheduler (0.33 or 0.32), worker aggregation and logger with the plugin:
what vLLM's ``KVConnectorLogging`` sums over steps (metrics.py:65-91) equals what FlexKV counted, at one and
two workers, and across FlexKV's own counter clears (``FLEXKV_NUM_LOG_INTERVAL_REQUESTS``).

The truth is every ``FlexKVStats.record_*`` call FlexKV made. Negative controls: FlexKV's own
``get_kv_connector_stats`` (cumulative counters every step) and an interval that forgets a clear.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from flexkv_adapter.integrations.vllm import stats as vllm_stats

from .engine import Engine

A = list(range(300, 348))
B = [*A, 1, 2, 3, 4, 5, 6, 7, 8]  # a FlexKV hit on A's blocks
C = list(range(500, 540))


@pytest.fixture
def real_stats(plugged, monkeypatch) -> Any:
    """FlexKV's real FlexKVStats (34ab141's stats.py, which zeroes itself every N gets) in its real adapter."""
    import importlib.util
    import sys
    from pathlib import Path

    from .conftest import REAL_ADAPTER

    path = Path(REAL_ADAPTER).parents[1] / "stats.py"
    spec = importlib.util.spec_from_file_location("flexkv_adapter_test_real_stats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys.modules["flexkv.integration.vllm.vllm_v1_adapter"], "FlexKVStats", module.FlexKVStats)
    return module.FlexKVStats


@pytest.fixture
def truth(real_stats, monkeypatch) -> Counter:
    """Every count FlexKV recorded, summed here (FlexKV's real FlexKVStats still records them)."""
    FlexKVStats = real_stats

    counts: Counter = Counter()
    get, put, fail = FlexKVStats.record_get, FlexKVStats.record_put, FlexKVStats.record_faild

    def record_get(self: Any, num_prompt_tokens: int, num_gpu_matched_tokens: int, num_flexkv_matched_tokens: int):
        counts.update(
            num_get_requests=1,
            num_get_query_tokens=num_prompt_tokens,
            num_gpu_matched_tokens=num_gpu_matched_tokens,
            num_flexkv_matched_tokens=num_flexkv_matched_tokens,
        )
        return get(self, num_prompt_tokens, num_gpu_matched_tokens, num_flexkv_matched_tokens)

    def record_put(self: Any, num_all_tokens: int, num_unmatched_tokens: int):
        counts.update(
            num_put_requests=1, num_put_query_tokens=num_all_tokens, num_put_unmatched_tokens=num_unmatched_tokens
        )
        return put(self, num_all_tokens, num_unmatched_tokens)

    def record_faild(self: Any, num_failed_requests: int):
        counts.update(num_failed_requests=num_failed_requests)
        return fail(self, num_failed_requests)

    monkeypatch.setattr(FlexKVStats, "record_get", record_get)
    monkeypatch.setattr(FlexKVStats, "record_put", record_put)
    monkeypatch.setattr(FlexKVStats, "record_faild", record_faild)
    return counts


def recording_scheduler() -> Any:
    """vLLM's Scheduler with stats on, keeping every SchedulerStats it makes (as the engine core sends them)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    class Recording(Scheduler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, log_stats=True, **kwargs)
            self.recorded: list[Any] = []

        def make_stats(self, *args: Any, **kwargs: Any) -> Any:
            stats = super().make_stats(*args, **kwargs)
            self.recorded.append(stats)
            return stats

    return Recording


def logged(engine: Engine) -> dict[str, Any]:
    """What vLLM's logger reports for the whole run: every step's stats observed, then reduced."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    logging_ = KVConnectorLogging(engine.config.kv_transfer_config)
    for stats in engine.scheduler.recorded:
        if stats is not None and stats.kv_connector_stats:
            logging_.observe(stats.kv_connector_stats)
    acc = logging_.transfer_stats_accumulator
    return dict(acc.reduce()) if acc is not None else {}


def serve_three(plugged: Any, tmp_path: Any, workers: int) -> Engine:
    engine = Engine(plugged, tmp_path, workers=workers, scheduler_cls=recording_scheduler())
    engine.serve("A", A)
    engine.forget_local()
    engine.serve("B", B)
    engine.serve("C", C)
    return engine


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("interval", ["200", "2"])  # "2": FlexKV zeroes its counters after B's get
def test_vllm_logs_what_flexkv_counted(plugged, tmp_path, truth, monkeypatch, workers, interval):
    monkeypatch.setenv("FLEXKV_NUM_LOG_INTERVAL_REQUESTS", interval)
    engine = serve_three(plugged, tmp_path, workers)
    assert truth["num_get_requests"] == 3 and truth["num_put_requests"] == 3
    assert truth["num_flexkv_matched_tokens"] == 48  # B's hit
    got = logged(engine)
    assert {k: got[k] for k in vllm_stats.COUNTERS} == {k: truth[k] for k in vllm_stats.COUNTERS}
    assert got["get_flexkv_match_ratio"] == pytest.approx(48 / truth["num_get_query_tokens"])


def test_negative_control_flexkv_cumulative_counters_are_summed_into_more(plugged, tmp_path, truth):
    plugged.get_kv_connector_stats = plugged.get_kv_connector_stats.__wrapped__  # FlexKV's own answer
    got = logged(serve_three(plugged, tmp_path, 1))
    assert got["num_get_requests"] > truth["num_get_requests"]


def test_negative_control_an_interval_that_forgets_a_clear_loses_counts(plugged, tmp_path, truth, monkeypatch):
    monkeypatch.setenv("FLEXKV_NUM_LOG_INTERVAL_REQUESTS", "2")
    monkeypatch.setattr(vllm_stats.Interval, "fold", lambda self, stats: None)
    got = logged(serve_three(plugged, tmp_path, 1))
    assert got["num_get_requests"] != truth["num_get_requests"]
