"""SGLang plugin, ``remote: external``: on node 1 the connector waits for start_remote and spawns nothing."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from flexkv_adapter.integrations.sglang.external_remote import ExternalRemote, ExternalRemoteError
from flexkv_adapter.integrations.sglang.plugin import IN_TREE_MODULE

from . import flexkv_standin as fk
from .connectors import OWN_MODULE, build
from .pools import mha_pool

NODE1 = {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"}


def test_remote_engine_leaves_flexkv_spawn_alone(sglang_env, models):
    sglang_env.use("old")
    sglang_env.load()
    build(mha_pool(), models["llama"], **NODE1)
    assert fk.calls("create_process") == [{"master_host": "10.0.0.1", "master_ports": ("5556", "5557", "5558")}]


@pytest.fixture
def start_remote_standin():
    """start_remote's own state tracker and health endpoint, without a FlexKV remote behind them."""
    from flexkv_adapter.remote.health import HealthServer
    from flexkv_adapter.remote.states import State, StateTracker

    tracker = StateTracker({"master": "10.0.0.1:5556", "node_rank": 1})
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    yield SimpleNamespace(tracker=tracker, port=server.address[1], State=State)
    server.stop()


@pytest.mark.parametrize("module", [IN_TREE_MODULE, OWN_MODULE], ids=["in-tree", "flexkv-own"])
def test_remote_external_waits_for_start_remote_and_spawns_nothing(sglang_env, models, start_remote_standin, module):
    standin = start_remote_standin
    standin.tracker.set(standin.State.HANDSHAKE)
    sglang_env.use("old" if module == IN_TREE_MODULE else "current")
    sglang_env.load(FLEXKV_ADAPTER_REMOTE="external", FLEXKV_ADAPTER_HEALTH_PORT=str(standin.port))
    start = time.monotonic()  # after loading: applying the hooks imports SGLang modules, which can take 0.6 s
    threading.Timer(0.6, standin.tracker.set, (standin.State.WAITING_FOR_GPUS,)).start()
    connector = build(mha_pool(), models["llama"], module=module, **NODE1)
    assert time.monotonic() - start >= 0.5  # it waited for waiting_for_gpus
    assert not fk.calls("create_process")
    assert isinstance(connector._remote_process, ExternalRemote) and len(fk.calls("register_to_server")) == 1
    connector.shutdown()  # terminate / join / is_alive on the handle: nothing to stop
    assert connector._remote_process is None


def test_remote_external_without_start_remote_fails_fast_naming_it(sglang_env, models):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sglang_env.use("old")
    sglang_env.load(
        FLEXKV_ADAPTER_REMOTE="external", FLEXKV_ADAPTER_HEALTH_PORT=str(port), FLEXKV_ADAPTER_REMOTE_ABSENT_S="1"
    )
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match="scripts/start_remote.py is not running on this node"):
        build(mha_pool(), models["llama"], **NODE1)
    assert time.monotonic() - start < 10
    assert not fk.calls("create_process") and not fk.calls("register_to_server")
