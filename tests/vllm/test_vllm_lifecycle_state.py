"""Reset, sleep/wake, FLEXKV_SYNC_GET and multimodal requests through vLLM's real Scheduler (0.32 or 0.33) and
worker driver with the plugin (FlexKV: the stand-in in ``fake_flexkv``, following 34ab141)."""

from __future__ import annotations

import sys

import pytest

from flexkv_adapter.flexkv.reset import repair_task_table
from flexkv_adapter.integrations.vllm import lifecycle as vllm_lifecycle

from .engine import Engine, flexkv_empty
from .test_vllm_lifecycle_loads import A, B, control, new_schedules, stored_a_then_forgot, unwrap

__all__ = ["control"]  # the fixture, shared


def test_reset_after_a_store_makes_the_next_identical_prompt_miss(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is True
    assert control["resets"] == 1
    engine.serve("A2", A)
    assert new_schedules(engine, "A2") == [0] and engine.flexkv.flexkv_stats.num_flexkv_matched_tokens == 0


def test_negative_control_flexkvs_reset_on_its_table_as_shipped_fails_and_flexkv_still_hits(
    plugged, tmp_path, control, monkeypatch
):
    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    monkeypatch.setattr(vllm_lifecycle, "repair_task_table", lambda manager: [])
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is False and control["resets"] == 0
    engine.serve("A2", A)
    assert new_schedules(engine, "A2") == [47]  # FlexKV still holds A


def test_negative_control_without_the_wrappers_the_reset_is_reported_but_flexkv_still_hits(plugged, tmp_path, control):
    engine = Engine(plugged, tmp_path)
    unwrap(plugged)
    engine.serve("A", A)
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is True and control["resets"] == 0
    engine.serve("A2", A)
    assert new_schedules(engine, "A2") == [47]  # a whole-prompt hit: vLLM recomputes only the last token


def test_reset_with_a_load_in_flight_lets_it_finish_with_the_right_kv(plugged, tmp_path, control):
    engine = stored_a_then_forgot(plugged, tmp_path)
    control["polls"] = 4
    b = engine.add("B", B)
    engine.run(lambda: engine.flexkv.get_tasks)
    assert engine.scheduler.reset_connector_cache() is True and control["resets"] == 1
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [48] and engine.holds("B", A, 3)
    engine.run(engine.idle)
    assert flexkv_empty(engine)


def test_reset_right_after_a_request_finished_still_frees_its_blocks(plugged, tmp_path):
    engine = Engine(plugged, tmp_path)
    engine.add("A", A)
    engine.run(lambda: engine.flexkv.tasks_to_launch)  # A finished; FlexKV's store launches with the next step
    assert engine.scheduler.reset_connector_cache() is True
    engine.run(engine.idle)  # A's blocks came back: its store was reported finished
    assert flexkv_empty(engine)


def test_negative_control_flexkvs_reset_alone_strands_the_loading_request(plugged, tmp_path, control):
    engine = stored_a_then_forgot(plugged, tmp_path)
    control["polls"] = 4
    b = engine.add("B", B)
    engine.run(lambda: engine.flexkv.get_tasks)
    repair_task_table(engine.flexkv.flexkv_manager)  # FlexKV's reset as it means it (without, it raises)
    assert engine.scheduler.connector._flexkv_connector.reset_cache() is True  # drops the task maps (adp:304)
    with pytest.raises(AssertionError, match="not reached"):
        engine.run(engine.idle, steps=10)
    assert b.status.name == "WAITING_FOR_REMOTE_KVS"


def test_a_failed_reset_or_a_wait_that_times_out_is_reported(plugged, tmp_path, control, monkeypatch):
    engine = stored_a_then_forgot(plugged, tmp_path)
    control["fail_reset"] = True
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is False
    control["fail_reset"], control["polls"] = False, 10**6
    monkeypatch.setattr(engine.scheduler.connector, vllm_lifecycle.RESET_WAIT, 0.02)  # reset_wait_s
    b = engine.add("B", B)
    engine.run(lambda: engine.flexkv.get_tasks)
    assert engine.scheduler.reset_connector_cache() is False and control["resets"] == 0
    control["polls"] = 1
    engine.run(lambda: b.status.name == "RUNNING")
    assert engine.holds("B", A, 3)


@pytest.mark.sleep_hooks
def test_sleep_then_wake_then_store_and_hit_again(plugged, tmp_path):
    from flexkv.server import client

    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    adapted = client.REGISTRATIONS[-1]["kv_layout"]
    assert engine.scheduler.reset_prefix_cache(reset_connector=True)  # what engine/core.py does before sleeping
    engine.worker.unregister_kv_caches()
    engine.worker.unregister_kv_caches()  # idempotent
    assert client.SUSPENDED and len(client.REGISTRATIONS) == 1
    engine.forget_local()  # the KV memory came back with other bytes
    engine.worker.restore_kv_caches()
    engine.worker.restore_kv_caches()  # idempotent
    assert not client.SUSPENDED and len(client.REGISTRATIONS) == 2
    assert client.REGISTRATIONS[-1]["resume"] and client.REGISTRATIONS[-1]["kv_layout"] == adapted
    engine.serve("A2", A)
    assert new_schedules(engine, "A2") == [0]  # FlexKV was reset before sleeping
    engine.forget_local()
    b = engine.add("B", B)
    engine.run(lambda: b.status.name == "RUNNING")
    assert new_schedules(engine, "B") == [48] and engine.holds("B", A, 3)


@pytest.mark.sleep_hooks
def test_a_discarded_kv_cache_registered_afresh_is_not_re_registered_on_wake(plugged, tmp_path):
    from flexkv.server import client

    engine = Engine(plugged, tmp_path)
    engine.worker.unregister_kv_caches()  # gpu_worker.py:371, discard(("kv_cache",))
    engine.worker.register_kv_caches(engine.kv_caches)  # vLLM allocates and registers again
    engine.worker.restore_kv_caches()
    assert len(client.REGISTRATIONS) == 2 and not client.REGISTRATIONS[-1]["resume"] and not client.SUSPENDED


@pytest.mark.sleep_hooks
def test_negative_control_without_the_wrappers_sleep_leaves_flexkv_mapped(plugged, tmp_path):
    from flexkv.server import client

    engine = Engine(plugged, tmp_path)
    unwrap(plugged)
    engine.worker.unregister_kv_caches()
    assert not client.SUSPENDED


@pytest.mark.parametrize("fail", [False, True])
def test_flexkv_sync_get_loads_are_reported(plugged, tmp_path, control, monkeypatch, fail):
    monkeypatch.setenv("FLEXKV_SYNC_GET", "1")
    engine = stored_a_then_forgot(plugged, tmp_path, policy="recompute")
    control["fail_gets"] = int(fail)
    b = engine.add("B", B)
    assert engine.run(lambda: b.status.name == "RUNNING") <= 3
    assert new_schedules(engine, "B") == [0 if fail else 48] and engine.holds("B", A, 3)
    engine.run(engine.idle)
    assert flexkv_empty(engine)


def test_negative_control_flexkv_sync_get_alone_hangs(plugged, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEXKV_SYNC_GET", "1")
    engine = stored_a_then_forgot(plugged, tmp_path)
    del engine.flexkv.wait_for_all_get_tasks  # FlexKV's own blocking wait
    b = engine.add("B", B)
    with pytest.raises(AssertionError, match="not reached"):
        engine.run(engine.idle, steps=10)
    assert b.status.name == "WAITING_FOR_REMOTE_KVS"


def image(identifier: str, offset: int = 16, length: int = 16):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return MultiModalFeatureSpec(
        data=None, modality="image", identifier=identifier, mm_position=PlaceholderRange(offset, length)
    )


@pytest.mark.parametrize("plugin", [True, False])
def test_multimodal_requests_with_the_same_placeholders_share_no_kv(plugged, tmp_path, plugin):
    """Scheduler-side calls as sched:1139 and sched:3395 make them (a text-only model cannot run images)."""
    from vllm.v1.request import RequestStatus

    engine = Engine(plugged, tmp_path)
    if not plugin:
        unwrap(plugged)
    connector = engine.scheduler.connector
    first = engine.add("img-A", A, mm_features=[image("cat")])
    engine.scheduler.waiting.remove_requests([first])
    first.status = RequestStatus.FINISHED_LENGTH_CAPPED
    first.append_output_token_ids([7, 7])
    stored, _ = connector.request_finished(first, list(range(1, 5)))
    engine.step()  # FlexKV launches and completes the store, if any
    second = engine.add("img-B", A, mm_features=[image("dog")])
    hit, _ = connector.get_num_new_matched_tokens(second, 0)
    assert (stored, hit) == ((False, 0) if plugin else (True, 48))  # without the plugin: the cat's KV for the dog


@pytest.mark.parametrize("plugin", [True, False])
def test_prompt_embeds_requests_neither_look_up_nor_store(plugged, tmp_path, plugin):
    import torch

    engine = Engine(plugged, tmp_path)
    engine.serve("A", A)
    if not plugin:
        unwrap(plugged)
    request = engine.add("E", A, prompt_embeds=torch.zeros(len(A), 8))
    hit = engine.scheduler.connector.get_num_new_matched_tokens(request, 0)
    assert hit == ((0, False) if plugin else (48, True))  # without the plugin: token A's KV for the embeddings


def test_best_effort_delivery_and_flexkvs_stats_reach_vllm(plugged, tmp_path):
    engine = Engine(plugged, tmp_path)
    assert engine.scheduler.requires_kv_delivery is False
    engine.serve("A", A)
    # vLLM's scheduler took each step's interval while serving (tests/vllm/test_vllm_stats.py sums them):
    # what is left after the run is an empty interval, in FlexKV's own stats type
    left = engine.scheduler.connector.get_kv_connector_stats()
    assert left is not None and left.reduce()["num_put_requests"] == 0
    stats = plugged.build_kv_connector_stats({"num_put_requests": 1})
    assert stats is not None and stats.reduce()["num_put_requests"] == 1


def test_the_tier_runs_the_flexkv_connector_code_it_names(plugged, tmp_path):
    from .conftest import FOUND, REAL_ADAPTER

    engine = Engine(plugged, tmp_path)
    source = sys.modules[type(engine.scheduler.connector._flexkv_connector).__module__].__file__
    assert source == REAL_ADAPTER and source.startswith(str(FOUND.root))


def test_a_flexkv_that_differs_is_refused_at_construction(plugged, tmp_path, monkeypatch):
    from flexkv.integration.vllm import vllm_v1_adapter

    from flexkv_adapter import AdapterError

    monkeypatch.delattr(vllm_v1_adapter.FlexKVSchedulerConnector, "get_and_clear_failed_block_ids")
    with pytest.raises(AdapterError, match="get_and_clear_failed_block_ids"):
        Engine(plugged, tmp_path)


def test_a_vllm_that_differs_is_refused_at_construction(connector_cls, tmp_path, monkeypatch):
    from flexkv_adapter import AdapterError
    from flexkv_adapter.integrations.vllm.plugin import install

    monkeypatch.setattr(connector_cls, "update_connector_output", lambda self, output, extra: None)
    install()
    with pytest.raises(AdapterError, match="update_connector_output"):
        Engine(connector_cls, tmp_path)


def test_the_metadata_reaches_worker_processes_intact():
    """Multiprocess executors pickle the scheduler output, metadata included, for every worker."""
    import pickle

    from flexkv_adapter.integrations.vllm.ledger import FlexKVAdapterMetadata

    meta = FlexKVAdapterMetadata(recving=frozenset({"B"}), load_errors=frozenset({4, 5, 6}))
    assert pickle.loads(pickle.dumps(meta)) == meta


def test_a_relative_ipc_server_recv_port_refuses_the_connector(plugged, tmp_path, monkeypatch):
    """FlexKV's server and each engine process would resolve it against their own working directory."""
    from flexkv_adapter.errors import SettingsError

    monkeypatch.setenv("FLEXKV_SERVER_RECV_PORT", "ipc://flexkv/sock")
    with pytest.raises(SettingsError, match="server_recv_port='ipc://flexkv/sock'.*relative ipc path"):
        Engine(plugged, tmp_path)
