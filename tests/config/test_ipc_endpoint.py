"""An ipc ``server_recv_port`` must name a socket, refused up front on every way in.

``ipc:///``, ``ipc:///tmp/``, ``ipc:///tmp/..`` name a directory and ``ipc://@`` an empty abstract name:
ZMQ refuses them only when FlexKV's server binds (EADDRINUSE / EINVAL), after the remote started, while
FlexKV's derived ``<path>_gpu_register`` binds fine. Each is a SettingsError at load, like a relative path.
"""

from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.errors import SettingsError

from ..strategies.remote import absolute_ipc_endpoints, ipc_endpoints_naming_no_socket


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("FLEXKV_"):
            monkeypatch.delenv(key)


@settings(max_examples=60, deadline=None)
@given(ipc_endpoints_naming_no_socket())
def test_an_ipc_endpoint_that_names_no_socket_is_refused(endpoint):
    with pytest.raises(SettingsError, match="names no socket"):
        load_settings(server_recv_port=endpoint)


@pytest.mark.parametrize("way", ["FLEXKV_SERVER_RECV_PORT", "FLEXKV_ADAPTER_SERVER_RECV_PORT", "config file"])
@pytest.mark.parametrize("endpoint", ["ipc:///", "ipc://@", "ipc:///tmp/flexkv/", "ipc:///tmp/.."])
def test_every_way_in_refuses_it(tmp_path, monkeypatch, way, endpoint):
    kwargs = {}
    if way == "config file":
        kwargs["config_file"] = tmp_path / "s.yaml"
        kwargs["config_file"].write_text(yaml.safe_dump({"server_recv_port": endpoint}))
    else:
        monkeypatch.setenv(way, endpoint)
    with pytest.raises(SettingsError, match="names no socket") as caught:
        load_settings(**kwargs)
    assert caught.value.keys == ("server_recv_port",)


@settings(max_examples=60, deadline=None)
@given(absolute_ipc_endpoints())
def test_control_socket_paths_and_abstract_names_load(endpoint):
    assert load_settings(server_recv_port=endpoint).server_recv_port == endpoint


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["tcp://10.0.0.1:6000", "IPC:///tmp/x", "ipc:/tmp/x", "inproc://x", "/tmp/x", "x"]))
def test_an_endpoint_that_is_not_ipc_is_refused(endpoint):
    # FlexKV connects to f"{server_recv_port}_gpu_register" and "..._control": a socket name only for ipc://
    with pytest.raises(SettingsError, match="not an ipc:// endpoint"):
        load_settings(server_recv_port=endpoint)
