"""``failed_visible_s``: after a failure start_remote serves ``failed`` this long, then exits with the
failure's status; a stop signal cuts it short, 0 exits at once, and values out of 0..60 are refused."""

from __future__ import annotations

import os
import signal
import time

import pytest
from hypothesis import given, settings

from flexkv_adapter.config.settings import FAILED_VISIBLE_MAX_S, load_settings
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.remote.exit_codes import ExitCode

from ..strategies.remote import values_outside
from .harness import Remote, free_ports, holding, run_once

LINE = "serving state failed for failed_visible_s="


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("FLEXKV_"):
            monkeypatch.delenv(key)


def test_the_default_and_both_bounds_load():
    assert load_settings().failed_visible_s == 2.0
    assert load_settings(failed_visible_s=0).failed_visible_s == 0
    assert load_settings(failed_visible_s=FAILED_VISIBLE_MAX_S).failed_visible_s == FAILED_VISIBLE_MAX_S


@settings(max_examples=60, deadline=None)
@given(values_outside(0.0, FAILED_VISIBLE_MAX_S))
def test_values_outside_0_to_60_are_refused_naming_the_setting(value):
    os.environ["FLEXKV_ADAPTER_FAILED_VISIBLE_S"] = str(value)  # the environment, as a deployment sets it
    try:
        with pytest.raises(SettingsError) as caught:
            load_settings()
    finally:
        del os.environ["FLEXKV_ADAPTER_FAILED_VISIBLE_S"]
    assert caught.value.keys == ("failed_visible_s",)
    with pytest.raises(SettingsError, match="failed_visible_s"):
        load_settings(failed_visible_s=value)


def test_start_remote_refuses_an_out_of_range_window_with_status_2():
    code, last = run_once("--master-host", "10.0.0.1", "--nnodes", "2", "--node-rank", "1", "--failed-visible", "61")
    assert code == ExitCode.SETTINGS and "failed_visible_s=61.0" in last and "less than or equal to 60" in last, last


def _until_failed(remote: Remote, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while remote.health()[1].get("state") != "failed":
        assert remote.proc.poll() is None and time.monotonic() < deadline, remote.finish()
        time.sleep(0.02)


def test_a_long_window_keeps_serving_failed_until_a_stop_signal_cuts_it_short(tmp_path):
    with holding() as busy:  # one master port accepts, the others do not: exit 10 after connect_timeout
        remote = Remote(tmp_path, ports=(busy, *free_ports(2)), connect_timeout=0.5, failed_visible=60)
        _until_failed(remote)
        for _ in range(40):  # 2 s and more of polls, past the old fixed window; far from 60 s
            time.sleep(0.1)
            assert remote.health()[1].get("state") == "failed"
        assert remote.proc.poll() is None
        code, err, _ = remote.stop(signal.SIGTERM)
    assert code == ExitCode.MASTER_UNREACHABLE, err  # the failure's status, not the signal's 0
    assert f"{LINE}60 s" in err
    assert list((tmp_path / "locks").iterdir()) == [] and os.listdir(remote.ipc) == []


def test_a_zero_window_exits_at_once_with_the_failures_status(tmp_path):
    with holding() as busy:
        remote = Remote(tmp_path, ports=(busy, *free_ports(2)), connect_timeout=0.5, failed_visible=0)
        code, _, err = remote.finish(timeout=30)
    assert code == ExitCode.MASTER_UNREACHABLE, err
    assert LINE not in err and "state: failed" in err
    assert list((tmp_path / "locks").iterdir()) == []
