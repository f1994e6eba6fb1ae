"""doctor's plugin selection: the value it found, read as the engine reads it, and the near miss named with its fix."""

from __future__ import annotations

import json
import os

import pytest

from flexkv_adapter.cli import doctor_plugins
from flexkv_adapter.cli.main import main

from .test_doctor_engines import _installed, _rows


def test_doctor_names_the_near_miss_in_sglang_plugins(monkeypatch):
    _installed(monkeypatch, {"sglang": "0.5.23"}, {"sglang"})
    status, detail = _rows({"SGLANG_PLUGINS": "flexkv-adapter"})["sglang plugin"]
    assert status == "error" and detail.startswith("not selected: SGLANG_PLUGINS='flexkv-adapter': ")
    assert "'flexkv-adapter' -> 'flexkv_adapter'" in detail and "saying so only at INFO" in detail
    assert detail.endswith("; set SGLANG_PLUGINS=flexkv_adapter")
    status, detail = _rows({"SGLANG_PLUGINS": "other, flexkv-adapter"})["sglang plugin"]
    assert status == "error" and detail.endswith("; set SGLANG_PLUGINS=other,flexkv_adapter")  # the rest kept
    # the control: the right spelling is selected, and the value shown
    assert _rows({"SGLANG_PLUGINS": "flexkv_adapter"})["sglang plugin"] == (
        "ok",
        "selected (SGLANG_PLUGINS='flexkv_adapter')",
    )


@pytest.mark.parametrize("typo", ["FlexKV_Adapter", "flexkv_adaptor", "flexkvadapter"])
def test_other_slips_in_sglang_plugins_are_near_misses_too(monkeypatch, typo):
    _installed(monkeypatch, {"sglang": "0.5.23"}, {"sglang"})
    status, detail = _rows({"SGLANG_PLUGINS": typo})["sglang plugin"]
    assert status == "error" and f"{typo!r} -> 'flexkv_adapter'" in detail, detail


def test_doctor_names_a_misnamed_sglang_plugins_variable(monkeypatch):
    _installed(monkeypatch, {"sglang": "0.5.23"}, {"sglang"})
    status, detail = _rows({"SGLANG_PLUGIN": "flexkv_adapter"})["sglang plugin"]
    assert status == "error" and "SGLANG_PLUGINS is unset, but SGLANG_PLUGIN='flexkv_adapter' is set" in detail
    assert "SGLANG_PLUGIN -> SGLANG_PLUGINS" in detail and detail.endswith("set SGLANG_PLUGINS=flexkv_adapter")
    status, detail = _rows({"sglang_plugins": "flexkv-adapter"})["sglang plugin"]  # case and dash at once
    assert status == "error" and "sglang_plugins -> SGLANG_PLUGINS" in detail
    # a misnamed variable that does not name the plugin is only mentioned; the right variable wins
    status, detail = _rows({"SGLANG_PLUGIN": "other"})["sglang plugin"]
    assert status == "warn" and "SGLANG_PLUGIN='other' is not read" in detail
    both = {"SGLANG_PLUGINS": "flexkv_adapter", "SGLANG_PLUGIN": "flexkv_adapter"}
    assert _rows(both)["sglang plugin"][0] == "ok"


def test_sglangs_allow_list_wins_over_the_opt_in(monkeypatch):
    """SGLang loads only the plugins SGLANG_PLUGINS names: FLEXKV_ADAPTER_SGLANG=1 cannot bring ours back."""
    _installed(monkeypatch, {"sglang": "0.5.23"}, {"sglang"})
    status, detail = _rows({"SGLANG_PLUGINS": "other", "FLEXKV_ADAPTER_SGLANG": "1"})["sglang plugin"]
    assert status == "warn" and "SGLANG_PLUGINS='other' leaves out flexkv_adapter" in detail
    assert detail.endswith("set SGLANG_PLUGINS=other,flexkv_adapter")
    status, detail = _rows({"FLEXKV_ADAPTER_SGLANG": "1"})["sglang plugin"]  # the control: no list, opt-in works
    assert status == "ok" and "FLEXKV_ADAPTER_SGLANG='1'; SGLANG_PLUGINS is unset" in detail


def test_doctor_names_the_near_miss_in_vllm_plugins(monkeypatch):
    _installed(monkeypatch, {"vllm": "0.33.0"}, {"vllm"})
    status, detail = _rows({"VLLM_PLUGINS": "a, flexkv_adapter"})["vllm plugin"]
    assert status == "error" and "' flexkv_adapter' -> 'flexkv_adapter'" in detail  # vLLM does not strip
    assert "keeps the spaces" in detail and detail.endswith("set VLLM_PLUGINS=a,flexkv_adapter")
    status, detail = _rows({"VLLM_PLUGINS": "flexkv-adapter"})["vllm plugin"]
    assert status == "error" and "'flexkv-adapter' -> 'flexkv_adapter'" in detail
    assert _rows({"VLLM_PLUGINS": "a,flexkv_adapter"})["vllm plugin"] == (
        "ok",
        "selected (VLLM_PLUGINS='a,flexkv_adapter')",
    )  # the control
    status, detail = _rows({"VLLM_PLUGIN": "flexkv_adapter"})["vllm plugin"]  # unset loads every plugin anyway
    assert status == "ok" and "VLLM_PLUGIN='flexkv_adapter' is not read (VLLM_PLUGIN -> VLLM_PLUGINS?)" in detail


def test_no_near_miss_is_claimed_for_unrelated_names():
    assert doctor_plugins._misnamed("sglang", {"SGLANG_PLATFORM": "x", "VLLM_PLUGINS": "y", "PATH": "/"}) == []
    assert not any(doctor_plugins._near(n) for n in ("flexkv", "other", "lmcache", ""))


def test_doctor_exits_1_on_a_near_miss_and_0_without(monkeypatch, capsys, no_flexkv):
    for key in [k for k in os.environ if k.startswith(("FLEXKV_", "SGLANG_", "VLLM_"))]:
        monkeypatch.delenv(key)
    _installed(monkeypatch, {"sglang": "0.5.23"}, {"sglang"})
    monkeypatch.setenv("SGLANG_PLUGINS", "flexkv-adapter")
    assert main(["doctor", "--json"]) == 1
    row = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "sglang plugin")
    assert row["status"] == "error" and "SGLANG_PLUGINS='flexkv-adapter'" in row["detail"]
    monkeypatch.setenv("SGLANG_PLUGINS", "flexkv_adapter")
    assert main(["doctor"]) == 0
    assert "selected (SGLANG_PLUGINS='flexkv_adapter')" in capsys.readouterr().out
