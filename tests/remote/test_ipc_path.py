"""A relative ``ipc://`` ``server_recv_port`` is refused on every way in: argument, FlexKV's and our
variables, the config file (argument or ``$FLEXKV_ADAPTER_CONFIG``), and start_remote's flag, env and
``--config`` (exit 2, one ERROR line). Relative, it names a different socket in each process's cwd."""

from __future__ import annotations

import os
import socket

import pytest
import yaml
from hypothesis import given, settings

from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.remote.exit_codes import ExitCode

from ..strategies.remote import absolute_ipc_endpoints, relative_ipc_endpoints
from .harness import run_once

RELATIVE = "ipc://flexkv/sock"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("FLEXKV_"):
            monkeypatch.delenv(key)


def _config(tmp_path, value: str):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"server_recv_port": value}))
    return path


@pytest.mark.parametrize(
    "way", ["argument", "FLEXKV_SERVER_RECV_PORT", "FLEXKV_ADAPTER_SERVER_RECV_PORT", "config file", "CONFIG env"]
)
def test_a_relative_ipc_path_is_refused_on_every_way_in(tmp_path, monkeypatch, way):
    kwargs = {}
    if way == "argument":
        kwargs["server_recv_port"] = RELATIVE
    elif way == "config file":
        kwargs["config_file"] = _config(tmp_path, RELATIVE)
    elif way == "CONFIG env":
        monkeypatch.setenv("FLEXKV_ADAPTER_CONFIG", str(_config(tmp_path, RELATIVE)))
    else:
        monkeypatch.setenv(way, RELATIVE)
    with pytest.raises(SettingsError, match=r"server_recv_port='ipc://flexkv/sock' .*relative ipc path") as caught:
        load_settings(**kwargs)
    assert "ipc:///tmp/flexkv_server" in str(caught.value) and caught.value.keys == ("server_recv_port",)


@settings(max_examples=60, deadline=None)
@given(relative_ipc_endpoints())
def test_any_relative_ipc_endpoint_is_refused(endpoint):
    with pytest.raises(SettingsError, match="relative ipc path"):
        load_settings(server_recv_port=endpoint)


@settings(max_examples=60, deadline=None)
@given(absolute_ipc_endpoints())
def test_absolute_and_abstract_ipc_endpoints_are_kept_as_given(endpoint):
    assert load_settings(server_recv_port=endpoint).server_recv_port == endpoint


@pytest.mark.parametrize("way", ["flag", "env", "config"])
def test_start_remote_refuses_a_relative_ipc_path_with_status_2_and_one_line(tmp_path, way):
    argv = ["--master-host", "10.0.0.1", "--nnodes", "2", "--node-rank", "1", "--dry-run"]
    env = {}
    if way == "flag":
        argv += ["--server-recv-port", RELATIVE]
    elif way == "env":
        env["FLEXKV_SERVER_RECV_PORT"] = RELATIVE
    else:
        argv += ["--config", str(_config(tmp_path, RELATIVE))]
    code, last = run_once(*argv, env=env)
    assert code == ExitCode.SETTINGS, last
    assert "ERROR start_remote: invalid settings: server_recv_port='ipc://flexkv/sock'" in last, last
    assert "relative ipc path" in last


def test_teardown_leaves_a_file_named_like_an_abstract_ipc_name_alone(tmp_path, monkeypatch):
    """``ipc://@name`` is abstract (no file); its name must not be read as a path in the cwd."""
    from flexkv_adapter.remote.teardown import _unlink_ipc

    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("@srv_gpu_register")  # a real socket file of this process, in the cwd
        _unlink_ipc("ipc://@srv_gpu_register")
        assert (tmp_path / "@srv_gpu_register").exists()
