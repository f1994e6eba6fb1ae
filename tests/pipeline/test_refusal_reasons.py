"""Refusals name the true reason: inputs that raised raw exceptions, misdiagnosed the problem, or built
unbounded messages (unreadable integers, resized storage, raising model configs, non-views for plan_vllm)
are each an AdapterError subclass with the true reason and a bounded message."""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import AdapterError, UnsupportedPoolError, adapt
from flexkv_adapter.errors import PlanError
from flexkv_adapter.flexkv import plan
from flexkv_adapter.flexkv.model import model_facts
from flexkv_adapter.flexkv.vllm_plan import plan_vllm

from ..helpers import SGLangLikeMHAPool, distinct
from ..readers.test_vllm_layout import views


class RaisingIndex:
    def __index__(self) -> int:
        raise RuntimeError("no index here")


def _pool() -> SGLangLikeMHAPool:
    return SGLangLikeMHAPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)


@pytest.mark.parametrize("value", [torch.tensor(16, device="meta"), RaisingIndex()], ids=["meta", "raising"])
def test_integers_that_cannot_be_read_are_adapter_errors(value):
    with pytest.raises(AdapterError, match="page_size"):
        adapt(_pool(), page_size=value)
    with pytest.raises(AdapterError, match="layer_ids"):
        adapt(_pool(), layer_ids=[value, 1])
    with pytest.raises(AdapterError, match="page_size"):
        plan(_pool(), page_size=value)
    pool = _pool()
    pool.head_num = value  # type: ignore[assignment]
    with pytest.raises(AdapterError, match="head_num"):
        adapt(pool)


@pytest.mark.parametrize("value", [16.0, torch.tensor(16.0)], ids=["float", "float-tensor"])
def test_pool_metadata_that_is_a_non_integer_number_is_refused_not_ignored(value):
    pool = _pool()
    pool.page_size = value  # type: ignore[assignment]
    with pytest.raises(AdapterError, match="page_size"):
        adapt(pool, page_size=32)


@pytest.mark.parametrize(
    "source",
    [
        lambda: distinct((2, 2, 32, 2, 8)),  # one flattened tensor
        lambda: [distinct((2, 32, 2, 8)), distinct((2, 32, 2, 8))],  # per-layer tensors
    ],
    ids=["flattened", "per-layer"],
)
def test_storage_resized_to_zero_is_refused_with_the_reason(source):
    tensors = source()
    for t in tensors if isinstance(tensors, list) else [tensors]:
        t.untyped_storage().resize_(0)
    for call in (lambda: adapt(tensors, page_size=16), lambda: plan(tensors, page_size=16)):
        with pytest.raises(UnsupportedPoolError, match="storage holds 0 bytes") as err:
            call()
        assert "please report" not in str(err.value)


def test_a_shrunk_vllm_buffer_is_diagnosed_as_shrunk():
    kv = views("LBNHC", 3, 4, 2, 4, 8)
    next(iter(kv.values())).untyped_storage().resize_(256)
    for call in (lambda: plan(kv, page_size=4, kind="mha"), lambda: plan_vllm(kv, kind="mha")):
        with pytest.raises(UnsupportedPoolError, match="storage holds 256 bytes") as err:
            call()
        assert "VLLM_KV_CACHE_LAYOUT" not in str(err.value)


class RaisingConfig:
    num_kv_heads, head_size, dtype, tp_size = 1, 8, torch.bfloat16, 1

    @property
    def num_layers(self) -> int:
        raise RuntimeError("not loaded")


class BadRepr:
    num_layers = 2

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_model_configs_that_raise_or_are_huge_give_bounded_plan_errors():
    with pytest.raises(PlanError, match="num_layers.*RuntimeError"):
        model_facts(RaisingConfig())
    with pytest.raises(PlanError, match="lacks"):
        model_facts(BadRepr())
    huge = {f"k{i}": i for i in range(100_000)}
    with pytest.raises(PlanError) as err:
        model_facts(huge)
    assert len(str(err.value)) < 1000
    with pytest.raises(PlanError) as err:
        plan(_pool(), model_config=huge)
    assert len(str(err.value)) < 1000


@pytest.mark.parametrize(
    "value",
    [
        lambda: torch.empty(4, 1, 4, 8, device="meta"),
        lambda: distinct((4, 4, 8)),
        lambda: distinct((4, 1, 4, 8, 2)),
        lambda: [distinct((4, 1, 4, 8))],
        lambda: "not a tensor",
    ],
    ids=["meta", "3-D", "5-D", "list", "str"],
)
def test_plan_vllm_of_values_that_are_not_vllm_views_is_an_adapter_error(value):
    kv = {"model.layers.0.attn": value(), "model.layers.1.attn": value()}
    with pytest.raises(AdapterError):
        plan_vllm(kv, kind="mla")


def test_plan_vllm_of_a_non_mapping_is_an_adapter_error():
    with pytest.raises(AdapterError):
        plan_vllm([distinct((4, 1, 4, 8))], kind="mla")  # type: ignore[arg-type]


def test_messages_with_huge_values_are_bounded():
    with pytest.raises(AdapterError) as err:
        adapt(_pool(), layer_ids=[*range(100_000), -1])
    assert len(str(err.value)) < 1000
    pool = _pool()
    pool.model_layer_ids = list(range(100_000))  # type: ignore[attr-defined]
    with pytest.raises(AdapterError) as err:
        adapt(pool)
    assert len(str(err.value)) < 1000
