"""register(): calls KVTPClient.register_to_server with the plan, retrying only transient failures."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.errors import FlexKVUnavailableError
from flexkv_adapter.flexkv import FlexKVPlan, plan, register

from ..helpers import SGLangLikeMHAPool


class RecordingClient:
    """Follows KVTPClient.register_to_server's signature; fails ``failures`` times first."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = list(failures or [])
        self.calls: list[tuple[list[torch.Tensor], object, int | None]] = []

    def register_to_server(
        self,
        kv_caches,
        kv_layout,
        override_device_id=None,
        layer_groups=None,
        gpu_layouts=None,
        handles_per_group=None,
        swa_caches=None,
        swa_layout=None,
        swa_layer_groups=None,
        swa_gpu_layouts=None,
        swa_handles_per_group=None,
        resume=False,
    ):
        self.calls.append((kv_caches, kv_layout, override_device_id))
        if self.failures:
            raise self.failures.pop(0)


def _view():
    return adapt(SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2))


def test_register_sends_the_tensors_in_flexkv_order_with_the_layout(fake_flexkv):
    view, client = _view(), RecordingClient()
    p = register(view, client, override_device_id=3, tp_size=2)
    ((tensors, layout, device),) = client.calls
    assert [t.data_ptr() for t in tensors] == [t.data_ptr() for t in view.k_buffer + view.v_buffer]
    assert layout.kv_shape == p.kv_shape and layout.num_kv_heads == 4 and device == 3


def test_transient_failures_are_retried(fake_flexkv, caplog):
    client = RecordingClient([RuntimeError("zmq not ready"), OSError("socket")])
    register(plan(_view()), client, interval_s=0)
    assert len(client.calls) == 3
    assert sum("retrying" in m for m in caplog.messages) == 2


def test_invalid_input_is_not_retried(fake_flexkv):
    client = RecordingClient([ValueError("GPU blocks must be CUDA tensors")])
    with pytest.raises(ValueError, match="CUDA"):
        register(_view(), client, interval_s=0)
    assert len(client.calls) == 1


def test_retries_are_bounded(fake_flexkv):
    client = RecordingClient([RuntimeError("down")] * 5)
    with pytest.raises(AdapterError, match="failed after 3 attempts: down"):
        register(_view(), client, attempts=3, interval_s=0)
    assert len(client.calls) == 3


def test_register_without_flexkv_names_the_fix(no_flexkv):
    with pytest.raises(FlexKVUnavailableError, match="taco-project/FlexKV"):
        register(_view(), RecordingClient())


class NoRegister:
    register_to_server = "not a method"


@pytest.mark.parametrize("client", [object(), NoRegister(), None])
def test_a_client_that_cannot_register_fails_at_once(fake_flexkv, client, monkeypatch):
    import time

    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("retried a programming error"))
    with pytest.raises(AdapterError, match="register_to_server"):
        register(_view(), client, interval_s=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": -1}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"attempts": "3"}, "attempts"),
        ({"interval_s": -1}, "interval_s"),
        ({"interval_s": float("nan")}, "interval_s"),
        ({"interval_s": float("inf")}, "interval_s"),
        ({"interval_s": True}, "interval_s"),
        ({"interval_s": "1"}, "interval_s"),
        ({"override_device_id": -1}, "override_device_id"),
        ({"override_device_id": True}, "override_device_id"),
        ({"override_device_id": "0"}, "override_device_id"),
    ],
)
def test_retry_options_are_validated_before_anything_runs(fake_flexkv, options, message):
    client = RecordingClient()
    with pytest.raises(AdapterError, match=message):
        register(_view(), client, **options)
    assert client.calls == []


@pytest.mark.parametrize("error", [AttributeError("no use_mla"), KeyError("x"), NotImplementedError("dsv4")])
def test_programming_errors_in_the_client_are_not_retried(fake_flexkv, error):
    client = RecordingClient([error])
    with pytest.raises(type(error)):
        register(_view(), client, interval_s=0)
    assert len(client.calls) == 1


def test_a_plan_whose_storage_was_freed_after_planning_is_refused_at_registration(fake_flexkv):
    pool = SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2)
    p, client = plan(adapt(pool)), RecordingClient()
    register(p, RecordingClient())  # negative control: the same plan, its memory alive, registers
    pool.k_buffer[1].untyped_storage().resize_(0)  # freed under the plan
    with pytest.raises(AdapterError, match=r"register\(.*tensor\(s\) \[1\] are not the memory plan\(\) admitted"):
        register(p, client)
    assert client.calls == []


def test_a_plan_of_meta_tensors_is_refused_at_registration(fake_flexkv):
    import dataclasses

    p, client = plan(_view()), RecordingClient()
    meta = dataclasses.replace(p, tensors=tuple(t.to("meta") for t in p.tensors))
    with pytest.raises(AdapterError, match="are not the memory plan\\(\\) admitted"):
        register(meta, client)
    assert client.calls == []


@pytest.mark.parametrize(
    ("typo", "meant"), [("attempt", "attempts"), ("tp_sise", "tp_size"), ("model_dtpye", "model_dtype")]
)
def test_misspelt_keywords_given_with_a_plan_are_refused_not_ignored(fake_flexkv, typo, meant):
    client = RecordingClient()
    with pytest.raises(AdapterError, match=f"unknown register\\(\\) keyword\\(s\\) '{typo}' \\(did you mean {meant}"):
        register(plan(_view()), client, **{typo: 3})
    assert client.calls == []


def test_plan_options_given_with_a_plan_are_refused_not_ignored(fake_flexkv):
    client = RecordingClient()
    with pytest.raises(AdapterError, match="takes no plan options \\(tp_size would be ignored"):
        register(plan(_view()), client, tp_size=2)
    assert client.calls == []


def _mha_pool() -> SGLangLikeMHAPool:
    return SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2)


@pytest.mark.parametrize(
    "change",
    [
        lambda p: dataclasses.replace(p, tensors=tuple(t[:16] for t in p.tensors)),  # fewer blocks
        lambda p: dataclasses.replace(p, tensors=tuple(t.float() for t in p.tensors)),  # another dtype
        lambda p: dataclasses.replace(p, tensors=(*p.tensors[:-1], p.tensors[0])),  # a layer swapped for another
        lambda p: dataclasses.replace(
            p, tensors=tuple(t.t().contiguous().t() if t.ndim == 2 else t.transpose(1, 2) for t in p.tensors)
        ),  # other strides
    ],
    ids=["fewer-blocks", "dtype", "swapped-layer", "strides"],
)
def test_a_plan_whose_tensors_were_swapped_after_planning_is_refused(fake_flexkv, change):
    p, client = plan(adapt(_mha_pool())), RecordingClient()
    with pytest.raises(AdapterError, match="not the memory plan\\(\\) admitted"):
        register(change(p), client)
    assert client.calls == []


def test_a_storage_resized_smaller_after_planning_is_refused(fake_flexkv):
    pool = _mha_pool()
    p, client = plan(adapt(pool)), RecordingClient()
    pool.v_buffer[0].untyped_storage().resize_(pool.v_buffer[0].untyped_storage().nbytes() // 2)
    with pytest.raises(AdapterError, match="not the memory plan\\(\\) admitted"):
        register(p, client)
    assert client.calls == []


def test_a_plan_built_by_hand_is_refused(fake_flexkv):
    p = plan(adapt(_mha_pool()))
    by_hand = FlexKVPlan(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "admitted"})
    with pytest.raises(AdapterError, match="not made by plan\\(\\)"):
        register(by_hand, RecordingClient())
    register(p, RecordingClient())  # negative control: plan()'s own plan of the same tensors registers
