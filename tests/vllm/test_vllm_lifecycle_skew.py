"""Skew the wrappers cannot see through signatures: vLLM's FlexKVConnectorV1 overriding a base-class
method that the failure report travels through on the workers (the driver calls
``get_transfer_results``, kv_connector.py:144; the base one asks ``get_finished``, base.py:416-424)."""

from __future__ import annotations

import pytest

from flexkv_adapter.integrations.vllm import lifecycle as vllm_lifecycle

from .engine import Engine
from .test_vllm_lifecycle_loads import A, B, control

__all__ = ["control"]


def asks_flexkv_directly(connector_cls, monkeypatch) -> None:
    """A vLLM whose FlexKVConnectorV1 answers get_transfer_results itself (same signature as the base)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

    def get_transfer_results(self, finished_req_ids):
        sending, recving = self._flexkv_connector.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(sending or ()), finished_recving=set(recving or ()))

    monkeypatch.setattr(connector_cls, "get_transfer_results", get_transfer_results, raising=False)


def test_a_vllm_that_overrides_the_workers_report_path_is_refused(connector_cls, tmp_path, monkeypatch):
    from flexkv_adapter import AdapterError
    from flexkv_adapter.integrations.vllm.plugin import install

    asks_flexkv_directly(connector_cls, monkeypatch)
    install()
    with pytest.raises(AdapterError, match="get_transfer_results"):
        Engine(connector_cls, tmp_path)


def test_negative_control_unchecked_a_failed_load_leaks_the_requests_blocks(
    connector_cls, tmp_path, monkeypatch, control
):
    from flexkv_adapter.integrations.vllm.plugin import install

    asks_flexkv_directly(connector_cls, monkeypatch)
    monkeypatch.setattr(vllm_lifecycle, "BASE_PATH", ())
    install()
    engine = Engine(connector_cls, tmp_path)
    engine.serve("A", A)
    engine.forget_local()
    control["fail_gets"] = 1
    engine.add("B", B)
    with pytest.raises(AssertionError, match="not reached"):
        engine.run(engine.idle)
    # vLLM ends B (its failed blocks did arrive) but frees an ended loading request's blocks only once it is
    # reported in finished_recving (sched:3017-3021), which the overriding path never does: they leak
    assert engine.scheduler.requests["B"].status.name == "FINISHED_ERROR"
    assert engine.scheduler.kv_cache_manager.get_block_ids("B")[0]
