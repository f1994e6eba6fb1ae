"""SGLang: the plugin's INFO line of FlexKV's hits and restored blocks (hits_log.attach on the bridge, fed by the
radix hooks), at most one per ``hits_log_interval_s``; the clock is injected, nothing sleeps. The hooks' counts on
SGLang's real radix cache: tests/sglang/test_sglang_bridge.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from flexkv_adapter.integrations.sglang import hits_log

LOGGER = hits_log.__name__


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Bridge:
    """The bridge as attach() sees it: which rank it is, FlexKV's page size."""

    leader = True

    def __init__(self, page_size: int = 16) -> None:
        self.connector = SimpleNamespace(page_size=page_size)
        self.fills = True


def _attached(monkeypatch: pytest.MonkeyPatch, interval: str, bridge: Bridge | None = None):
    monkeypatch.delenv("FLEXKV_ADAPTER_CONFIG", raising=False)
    monkeypatch.setenv("FLEXKV_ADAPTER_HITS_LOG_INTERVAL_S", interval)
    bridge = bridge or Bridge()
    clock = Clock()
    return bridge, clock, hits_log.attach(bridge, clock=clock)


def _serve(bridge: Bridge, prompt: int, hit: int) -> None:
    """One request as the plugin's radix hooks count it: its match (lookups.py), then its load (flush.py)."""
    hits = bridge.hits_log
    if hits is None:
        return
    hits.lookup(prompt, hit)
    if hit > 0:
        hits.load(hit, hit if bridge.fills else 0)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_the_line_reports_hits_and_restored_blocks_once_the_interval_has_passed(monkeypatch, caplog):
    bridge, clock, _ = _attached(monkeypatch, "60")
    caplog.set_level(logging.INFO, logger=LOGGER)
    _serve(bridge, prompt=128, hit=64)
    _serve(bridge, prompt=128, hit=0)
    assert _lines(caplog) == []
    clock.now += 60
    _serve(bridge, prompt=64, hit=32)  # its lookup logs the two requests before it; it is the next line's
    assert _lines(caplog) == [
        "flexkv_adapter: FlexKV in the last 60 s: 64 of 256 prompt tokens hit (25.0%), 4 blocks of 16 tokens "
        "restored; 2 lookups (1 hits), 1 loads, 0 failed"
    ]


def test_at_most_one_line_per_interval(monkeypatch, caplog):
    bridge, clock, _ = _attached(monkeypatch, "10")
    caplog.set_level(logging.INFO, logger=LOGGER)
    _serve(bridge, prompt=32, hit=16)
    clock.now += 10
    _serve(bridge, prompt=32, hit=16)
    for _ in range(9):  # 9 s of steady hits after the line: none logged
        clock.now += 1
        _serve(bridge, prompt=32, hit=16)
    assert len(_lines(caplog)) == 1
    clock.now += 1
    _serve(bridge, prompt=32, hit=16)
    assert len(_lines(caplog)) == 2
    assert "160 of 320 prompt tokens hit (50.0%), 10 blocks of 16 tokens restored; 10 lookups" in _lines(caplog)[1]


def test_a_load_that_fills_nothing_counts_as_failed_not_restored(monkeypatch, caplog):
    bridge, clock, _ = _attached(monkeypatch, "5")
    caplog.set_level(logging.INFO, logger=LOGGER)
    bridge.fills = False
    _serve(bridge, prompt=64, hit=48)
    clock.now += 5
    _serve(bridge, prompt=64, hit=0)
    assert (
        "48 of 64 prompt tokens hit (75.0%), 0 blocks of 16 tokens restored; 1 lookups (1 hits), 1 loads, 1 failed"
        in (_lines(caplog)[0])
    )


def test_a_quiet_interval_logs_nothing(monkeypatch, caplog):
    bridge, clock, _ = _attached(monkeypatch, "5")
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock.now += 500
    _serve(bridge, prompt=64, hit=0)  # the first request after 500 quiet seconds: nothing before it to log
    assert _lines(caplog) == []


def test_interval_zero_or_another_tp_rank_logs_nothing(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    bridge, clock, hits = _attached(monkeypatch, "0")
    follower = Bridge()
    follower.leader = False
    _, _, follower_hits = _attached(monkeypatch, "1", follower)
    assert hits is None and follower_hits is None
    assert bridge.hits_log is None and follower.hits_log is None
    clock.now += 3600
    _serve(bridge, prompt=64, hit=64)
    _serve(follower, prompt=64, hit=64)
    assert _lines(caplog) == []


def test_attach_wraps_none_of_the_bridges_calls(monkeypatch):
    bridge, _, hits = _attached(monkeypatch, "60")
    assert hits is bridge.hits_log and set(vars(bridge)) == {"connector", "fills", "hits_log"}
