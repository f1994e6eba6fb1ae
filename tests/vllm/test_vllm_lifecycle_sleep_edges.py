"""Sleep/wake edges on the worker side of vLLM's FlexKVConnectorV1 with the plugin (gpu_worker.py:319, 344)."""

from __future__ import annotations

import pytest

from .engine import Engine


@pytest.mark.sleep_hooks
def test_wake_without_sleep_registers_nothing_and_a_failed_wake_can_be_retried(plugged, tmp_path, monkeypatch):
    from flexkv.server import client

    engine = Engine(plugged, tmp_path, workers=2)
    engine.workers[0].restore_kv_caches()  # wake without sleep
    assert len(client.REGISTRATIONS) == 2 and not client.SUSPENDED
    for worker in engine.workers:
        worker.unregister_kv_caches()
    tp_client = type(engine.workers[0]._flexkv_connector.connector.tp_client)
    register = tp_client.register_to_server

    def broken(self, *args, **kwargs):
        raise RuntimeError("FlexKV server unreachable")

    monkeypatch.setattr(tp_client, "register_to_server", broken)
    with pytest.raises(RuntimeError, match="unreachable"):
        engine.workers[0].restore_kv_caches()
    monkeypatch.setattr(tp_client, "register_to_server", register)
    for worker in engine.workers:  # vLLM's retry of wake_up
        worker.restore_kv_caches()
    assert [r["resume"] for r in client.REGISTRATIONS[2:]] == [True, True] and not client.SUSPENDED
