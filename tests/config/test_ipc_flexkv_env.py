"""``server_recv_port`` must be the value FlexKV itself reads (``FLEXKV_SERVER_RECV_PORT``), whatever way in.

FlexKV takes the port from its own environment variable at import; a different value given as an argument,
as ``FLEXKV_ADAPTER_SERVER_RECV_PORT`` or in the YAML file passed every check, then FlexKV bound another
socket (a relative one, unchecked), and start_remote's clean-up unlinked the wrong files. (The YAML file
ranks below FlexKV's variable, so there the variable's value is taken, and checked.)
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.errors import SettingsError

GOOD = ["ipc:///tmp/flexkv_server", "ipc:///run/fk/a", "ipc://@flexkv"]


def _load(tmp_path, way: str, value: str):
    if way == "argument":
        return load_settings(None, server_recv_port=value)
    config = tmp_path / "s.yaml"
    config.write_text(f"server_recv_port: {value!r}\n")
    return load_settings(str(config))


@pytest.mark.parametrize("way", ["argument", "yaml", "own-variable"])
@settings(max_examples=25, deadline=None)
@given(ours=st.sampled_from(GOOD), flexkvs=st.sampled_from([*GOOD, "ipc://relative", "tcp://h:1"]))
def test_a_value_flexkv_would_not_read_is_refused(tmp_path_factory, way, ours, flexkvs):
    tmp_path = tmp_path_factory.mktemp("cfg")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEXKV_SERVER_RECV_PORT", flexkvs)
        if way == "own-variable":
            mp.setenv("FLEXKV_ADAPTER_SERVER_RECV_PORT", ours)
            load = lambda: load_settings(None)  # noqa: E731
        else:
            load = lambda: _load(tmp_path, way, ours)  # noqa: E731
        if way == "yaml":  # FlexKV's variable ranks above the file: the value is FlexKV's, checked
            if flexkvs in GOOD:
                assert load().server_recv_port == flexkvs
            else:
                with pytest.raises(SettingsError):
                    load()
        elif ours == flexkvs:
            assert load().server_recv_port == ours
        else:
            with pytest.raises(SettingsError, match="which FlexKV reads itself") as caught:
                load()
            assert "server_recv_port" in caught.value.keys


def test_flexkvs_variable_alone_is_checked_and_used(monkeypatch):
    monkeypatch.setenv("FLEXKV_SERVER_RECV_PORT", "ipc:///tmp/x")
    assert load_settings(None).server_recv_port == "ipc:///tmp/x"
    monkeypatch.setenv("FLEXKV_SERVER_RECV_PORT", "ipc://relative")
    with pytest.raises(SettingsError, match="relative"):
        load_settings(None)


def test_without_flexkvs_variable_any_valid_value_loads(monkeypatch):
    monkeypatch.delenv("FLEXKV_SERVER_RECV_PORT", raising=False)
    assert load_settings(None, server_recv_port="ipc:///run/other").server_recv_port == "ipc:///run/other"
