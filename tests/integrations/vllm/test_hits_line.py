"""vLLM: the plugin's INFO line of FlexKV's hits and restored blocks, from the counts vLLM's stats flow through
(``get_kv_connector_stats``), at most one per ``hits_log_interval_s``; the clock is injected, nothing sleeps."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from flexkv_adapter.integrations.vllm import stats as vllm_stats

LOGGER = vllm_stats.__name__


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stats:  # vLLM's FlexKV stats type: built with data=
    def __init__(self, data: dict) -> None:
        self.data = data


def _connector(monkeypatch: pytest.MonkeyPatch, interval: str, block_size: object = 16):
    monkeypatch.delenv("FLEXKV_ADAPTER_CONFIG", raising=False)
    monkeypatch.setenv("FLEXKV_ADAPTER_HITS_LOG_INTERVAL_S", interval)
    counters = SimpleNamespace(**dict.fromkeys(vllm_stats.COUNTERS, 0))
    impl = SimpleNamespace(role=SimpleNamespace(name="SCHEDULER"), connector=SimpleNamespace(flexkv_stats=counters))
    if block_size is not None:
        impl.connector.block_size = block_size
    conn = SimpleNamespace(_flexkv_connector=impl)
    clock = Clock()
    vllm_stats.attach(conn, clock=clock)
    ask = vllm_stats.wrap(lambda self: Stats({}))
    return conn, counters, clock, lambda: ask(conn)


def _request(counters: SimpleNamespace, prompt: int, on_gpu: int, from_flexkv: int) -> None:
    """What FlexKV's record_get adds for one request (flexkv/integration/stats.py)."""
    counters.num_get_requests += 1
    counters.num_get_query_tokens += prompt
    counters.num_gpu_matched_tokens += on_gpu
    counters.num_flexkv_matched_tokens += from_flexkv


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_the_line_sums_every_step_of_the_interval_with_hits_and_restored_blocks(monkeypatch, caplog):
    _, counters, clock, ask = _connector(monkeypatch, "60")
    caplog.set_level(logging.INFO, logger=LOGGER)
    _request(counters, prompt=256, on_gpu=0, from_flexkv=128)
    ask()
    clock.now += 30
    _request(counters, prompt=256, on_gpu=64, from_flexkv=64)
    counters.num_put_requests += 1
    ask()
    assert _lines(caplog) == []  # 30 s: not yet
    clock.now += 31
    ask()
    assert _lines(caplog) == [
        "flexkv_adapter: FlexKV in the last 61 s: 192 of 512 prompt tokens hit (37.5%), 12 blocks of 16 tokens "
        "restored; 2 lookups, 64 tokens already on the GPU, 1 stores, 0 failed"
    ]


def test_at_most_one_line_per_interval_and_the_next_counts_only_what_came_after(monkeypatch, caplog):
    _, counters, clock, ask = _connector(monkeypatch, "60")
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock.now += 60
    _request(counters, prompt=100, on_gpu=0, from_flexkv=32)
    ask()
    for _ in range(5):  # busy steps within the next 59 s: no second line
        clock.now += 10
        _request(counters, prompt=100, on_gpu=0, from_flexkv=16)
        ask()
    assert len(_lines(caplog)) == 1
    clock.now += 10
    ask()
    assert len(_lines(caplog)) == 2
    assert "80 of 500 prompt tokens hit (16.0%), 5 blocks of 16 tokens restored; 5 lookups" in _lines(caplog)[1]


def test_a_quiet_interval_logs_nothing(monkeypatch, caplog):
    _, _, clock, ask = _connector(monkeypatch, "60")
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(3):
        clock.now += 61
        ask()
    assert _lines(caplog) == []


def test_interval_zero_logs_nothing_however_busy(monkeypatch, caplog):
    _, counters, clock, ask = _connector(monkeypatch, "0")
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(3):
        clock.now += 3600
        _request(counters, prompt=64, on_gpu=0, from_flexkv=64)
        ask()
    assert _lines(caplog) == []


def test_without_flexkvs_block_size_the_line_says_tokens(monkeypatch, caplog):
    _, counters, clock, ask = _connector(monkeypatch, "1", block_size=None)
    caplog.set_level(logging.INFO, logger=LOGGER)
    _request(counters, prompt=64, on_gpu=0, from_flexkv=48)
    clock.now += 1
    ask()
    assert "48 of 64 prompt tokens hit (75.0%), 48 tokens restored" in _lines(caplog)[0]


def test_the_stats_vllm_receives_are_unchanged_by_the_line(monkeypatch, caplog):
    _, counters, clock, ask = _connector(monkeypatch, "60")
    _request(counters, prompt=64, on_gpu=0, from_flexkv=32)
    clock.now += 61
    data = ask().data
    assert data["num_flexkv_matched_tokens"] == 32 and data["get_flexkv_match_ratio"] == 0.5
