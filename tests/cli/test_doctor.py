"""flexkv-adapter doctor: table and JSON, sources, consistency problems, exit status."""

from __future__ import annotations

import json
import os

import pytest

from flexkv_adapter.cli.main import main


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("FLEXKV_"):
            monkeypatch.delenv(key)


def _doctor(capsys, *args):
    code = main(["doctor", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _check(result, name):
    return next(c for c in result["checks"] if c["name"] == name)


def test_healthy_single_node_passes_and_reports_sources(capsys, monkeypatch, no_flexkv):
    monkeypatch.setenv("FLEXKV_MASTER_PORTS", "7000,7001,7002")
    code, result = _doctor(capsys)
    assert code == 0 and result["ok"]
    assert _check(result, "flexkv")["status"] == "warn"
    assert "build it from source" in _check(result, "flexkv")["detail"]  # how to get it, as start_remote says
    assert result["settings"]["master_ports"] == {"value": [7000, 7001, 7002], "source": "env FLEXKV_MASTER_PORTS"}
    assert result["settings"]["tp_size"]["source"] == "default"


def test_flexkv_can_be_required(capsys, no_flexkv):
    code, result = _doctor(capsys, "--require-flexkv")
    assert code == 1 and _check(result, "flexkv")["status"] == "error"


def test_flexkv_layout_module_found(capsys, fake_flexkv):
    _, result = _doctor(capsys)
    assert _check(result, "flexkv")["status"] == "ok"
    assert _check(result, "flexkv.c_ext")["status"] == "warn"


@pytest.mark.parametrize(
    ("env", "status", "detail"),
    [
        ({}, "error", "unset while nnodes=2"),
        ({"FLEXKV_MASTER_HOST": "127.0.0.1"}, "error", "loopback"),
        ({"FLEXKV_MASTER_HOST": "localhost"}, "error", "loopback"),
        ({"FLEXKV_MASTER_HOST": "127.0.0.1", "FLEXKV_ADAPTER_ALLOW_LOOPBACK_MASTER": "1"}, "ok", "loopback"),
        ({"FLEXKV_MASTER_HOST": "10.1.2.3"}, "ok", "private"),
        ({"FLEXKV_MASTER_HOST": "8.8.8.8"}, "warn", "trusted network"),
        ({"FLEXKV_MASTER_HOST": "no-such-host.invalid"}, "error", "does not resolve"),
    ],
)
def test_multi_node_master_address(capsys, monkeypatch, env, status, detail):
    monkeypatch.setenv("FLEXKV_ADAPTER_NNODES", "2")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, result = _doctor(capsys)
    check = _check(result, "master_host")
    assert check["status"] == status and detail in check["detail"]
    assert code == (1 if status == "error" else 0)


def test_head_settings_and_invalid_settings(capsys, monkeypatch):
    monkeypatch.setenv("FLEXKV_ADAPTER_TP_SIZE", "4")
    monkeypatch.setenv("FLEXKV_ADAPTER_TOTAL_KV_HEADS", "6")
    code, result = _doctor(capsys)
    assert code == 1 and "not divisible" in _check(result, "kv_heads")["detail"]
    monkeypatch.setenv("FLEXKV_ADAPTER_TP_SIZE", "8")  # 6 heads on 8 ranks: replicated GQA
    code, result = _doctor(capsys)
    assert code == 1 and "counts the replicas" in _check(result, "kv_heads")["detail"]
    monkeypatch.setenv("FLEXKV_ADAPTER_TOTAL_KV_HEADS", "1")  # MQA: every rank holds the one head
    code, result = _doctor(capsys)
    assert code == 0 and _check(result, "kv_heads")["status"] == "ok"
    monkeypatch.setenv("FLEXKV_ADAPTER_TP_SIZE", "zero")
    code, result = _doctor(capsys)
    assert code == 1 and "tp_size='zero'" in _check(result, "settings")["detail"]


def test_table_output(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("python") and "settings:" in out and "(default)" in out
