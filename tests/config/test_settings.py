"""Settings: precedence, FlexKV's variables, YAML, and load-time errors that name key, value and source."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from flexkv_adapter.config.settings import AdapterSettings, load_settings, setting_sources
from flexkv_adapter.errors import SettingsError

EXAMPLE = Path(__file__).parents[2] / "configs" / "flexkv-adapter.example.yaml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("FLEXKV_"):
            monkeypatch.delenv(key)


def _yaml(tmp_path, data) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults():
    s = load_settings()
    assert s.master_ports == (5556, 5557, 5558) and s.master_host is None and s.hybrid == "error"


def test_the_shipped_example_config_loads():
    assert isinstance(load_settings(EXAMPLE), AdapterSettings)


def test_precedence_argument_env_flexkv_env_file_default(tmp_path, monkeypatch):
    path = _yaml(tmp_path, {"master_host": "10.0.0.4", "tp_size": 2, "page_size": 32, "nnodes": 2})
    assert load_settings(path).master_host == "10.0.0.4"
    monkeypatch.setenv("FLEXKV_MASTER_HOST", "10.0.0.3")
    assert load_settings(path).master_host == "10.0.0.3"
    monkeypatch.setenv("FLEXKV_ADAPTER_MASTER_HOST", "10.0.0.2")
    assert load_settings(path).master_host == "10.0.0.2"
    s = load_settings(path, master_host="10.0.0.1")
    assert (s.master_host, s.tp_size, s.page_size) == ("10.0.0.1", 2, 32)
    monkeypatch.setenv("FLEXKV_ADAPTER_CONFIG", str(path))
    sources = setting_sources(path, {"master_host": "x"})
    assert sources["master_host"] == "argument"
    assert sources["tp_size"] == f"file {path}"
    assert sources["hybrid"] == "default"
    assert load_settings().tp_size == 2  # the file named by FLEXKV_ADAPTER_CONFIG


def test_flexkv_master_ports_format_is_accepted(monkeypatch):
    monkeypatch.setenv("FLEXKV_MASTER_PORTS", "6000, 6001,6002")
    assert load_settings().master_ports == (6000, 6001, 6002)
    monkeypatch.setenv("FLEXKV_SERVER_RECV_PORT", "ipc:///tmp/x")
    assert load_settings().server_recv_port == "ipc:///tmp/x"
    assert setting_sources()["master_ports"] == "env FLEXKV_MASTER_PORTS"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLEXKV_MASTER_PORTS": "6000,6001,70000"}, "master_ports=70000 (from env FLEXKV_MASTER_PORTS)"),
        ({"FLEXKV_MASTER_PORTS": "6000,6000,6001"}, "must be distinct"),
        ({"FLEXKV_MASTER_PORTS": "a,b,c"}, "comma-separated port numbers"),
        ({"FLEXKV_ADAPTER_TP_SIZE": "two"}, "tp_size='two' (from env FLEXKV_ADAPTER_TP_SIZE)"),
        ({"FLEXKV_ADAPTER_HYBRID": "maybe"}, "'error' or 'attention_only'"),
        ({"FLEXKV_ADAPTER_TP_SIZ": "2"}, "did you mean FLEXKV_ADAPTER_TP_SIZE"),
        ({"FLEXKV_ADAPTER_NNODES": "2", "FLEXKV_ADAPTER_NODE_RANK": "2"}, "node_rank 2 must be < nnodes 2"),
    ],
)
def test_invalid_environment_fails_at_load_time(monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError, match=message.replace("(", "\\(").replace(")", "\\)")):
        load_settings()


def test_unknown_or_wrong_keys_in_the_file(tmp_path):
    with pytest.raises(SettingsError, match="tp_sise=3 \\(from file .*\\): unknown key \\(did you mean tp_size\\?\\)"):
        load_settings(_yaml(tmp_path, {"tp_sise": 3}))
    with pytest.raises(SettingsError, match="health_port=0"):
        load_settings(_yaml(tmp_path, {"health_port": 0}))
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml")


def test_settings_are_frozen():
    with pytest.raises(Exception, match="frozen"):
        load_settings().tp_size = 3


def test_the_example_file_shows_every_setting_and_its_uncommented_values_are_the_defaults(monkeypatch):
    for key in [k for k in os.environ if k.startswith("FLEXKV_")]:
        monkeypatch.delenv(key)
    path = Path(__file__).parents[2] / "configs" / "flexkv-adapter.example.yaml"
    text = path.read_text()
    shown = set(re.findall(r"^#? ?([a-z_]+):", text, flags=re.M))
    assert set(AdapterSettings.model_fields) - shown == set(), "settings the example file does not show"
    written = yaml.safe_load(text)
    defaults = AdapterSettings().model_dump()
    loaded = load_settings(path).model_dump()
    assert {k: loaded[k] for k in written} == {k: defaults[k] for k in written}
