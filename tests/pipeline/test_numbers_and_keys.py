"""adapt()/plan(): numbers and dict keys go through the one integer rule and bounded messages.

An ``__index__`` returning ``True`` read as 1 (operator.index converts it); ``model_config.kv_dim`` was
checked with ``in (1, 2)``, which takes ``True`` and ``2.0``; dict keys whose ``__str__``/``__repr__`` raise
gave raw errors, and a huge key gave an unbounded message.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flexkv_adapter import AdapterError, AmbiguousLayoutError, InconsistentLayersError, adapt
from flexkv_adapter.config.integers import read_integer
from flexkv_adapter.errors import PlanError
from flexkv_adapter.flexkv import plan
from flexkv_adapter.flexkv.model import model_facts

from ..helpers import SGLangLikeMHAPool, distinct
from ..readers.test_vllm_layout import views


class TrueIndex:
    """``__index__`` returns True: operator.index gives 1 (with a DeprecationWarning)."""

    def __index__(self) -> int:
        return True


class Index:
    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n


def _pool(**meta: object) -> SGLangLikeMHAPool:
    pool = SGLangLikeMHAPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)
    for name, value in meta.items():
        setattr(pool, name, value)
    return pool


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_index_hook_returning_true_is_a_bool_everywhere():
    with pytest.raises(AdapterError, match="page_size"):
        adapt(_pool(page_size=TrueIndex()))
    with pytest.raises(AdapterError, match="start_layer"):
        adapt(_pool(start_layer=TrueIndex()))
    with pytest.raises(AdapterError, match="layer_ids"):
        adapt(_pool(), layer_ids=[TrueIndex(), 5])
    with pytest.raises(AdapterError, match="tp_size"):
        plan(_pool(), tp_size=TrueIndex())
    # the control: the same hook returning an int is read
    view = adapt(_pool(start_layer=Index(3)))
    assert view.layer_ids == [3, 4] and type(read_integer(Index(7), "x")) is int


def test_model_config_kv_dim_goes_through_the_one_integer_reader():
    base = {"num_layers": 2, "num_kv_heads": 2, "head_size": 4, "dtype": torch.float32, "tp_size": 1}
    for bad in (True, 2.0, 1.0, 3, "2"):
        with pytest.raises(PlanError, match="kv_dim"):
            model_facts({**base, "kv_dim": bad})
    assert model_facts({**base, "kv_dim": torch.tensor(2)}).kv_dim == 2
    assert model_facts({**base, "kv_dim": 1}).kv_dim == 1


class BadText:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class HugeText:
    def __str__(self) -> str:
        return "layers.9" + ".x" * 200_000

    __repr__ = __str__


@pytest.mark.parametrize("key", [BadText(), HugeText()], ids=["raising", "huge"])
def test_hostile_dict_keys_give_bounded_adapter_errors(key):
    kv = views("LBNHC", 2, 4, 1, 4, 8)
    names = list(kv)
    direct = {names[0]: kv[names[0]], key: kv[names[1]]}
    for call in (lambda: adapt(direct, page_size=4, kind="mla"), lambda: plan(direct, page_size=4, kind="mla")):
        with pytest.raises(InconsistentLayersError, match="not layer names") as err:
            call()
        assert len(str(err.value)) < 600
    k = {"layers.0": distinct((32, 2, 4)), key: distinct((32, 2, 4), start=300)}
    v = {"layers.0": distinct((32, 2, 4), start=600), key: distinct((32, 2, 4), start=900)}
    pool = SimpleNamespace(k_buffer=k, v_buffer=v)
    with pytest.raises(AmbiguousLayoutError, match="layer_ids=") as err:
        adapt(pool, page_size=16)
    assert len(str(err.value)) < 600
    view = adapt(pool, page_size=16, layer_ids=[0, 4])  # layer_ids= settles it, in the dict's order
    assert view.layer_ids == [0, 4] and view.k_buffer[1].data_ptr() == k[key].data_ptr()


def test_every_message_is_bounded_whatever_path_builds_it():
    huge_class = type("P" * 100_000, (), {})
    pool = huge_class()
    pool.k_buffer, pool.v_buffer, pool.page_size = [distinct((32, 2, 4))], [distinct((32, 2, 4), start=99)], 32
    calls = [
        lambda: adapt(pool, page_size=16),  # a hostile class name
        lambda: adapt(SimpleNamespace(), attrs=["a" * 100_000, "b" * 100_000], page_size=16),  # attrs= paths
        lambda: plan(SimpleNamespace(), attrs=["a" * 100_000, "b" * 100_000], page_size=16),
        lambda: adapt(pool, axes="N " * 50_000),
        lambda: adapt(pool, **{"z" * 100_000: 1}),  # an option name
    ]
    for call in calls:
        with pytest.raises(AdapterError) as err:
            call()
        assert len(str(err.value)) < 8100 and "characters left out" in str(err.value)
    assert str(AdapterError("short")) == "short"  # the control: short messages are untouched


@pytest.mark.parametrize(
    "ids, accepted",
    [
        ({3}, False),  # a set, a dict, an iterator: they claim ids; ignoring them labelled the layer 0
        ({3: "attn"}, False),
        (iter([3]), False),
        ([3], True),
        (range(3, 4), True),
        (np.array([3]), True),  # a 1-D array: its elements go through the one integer reader
        (torch.tensor([3]), True),
        (np.array([True]), False),
    ],
    ids=["set", "dict", "iterator", "list", "range", "ndarray", "tensor", "bool-array"],
)
def test_model_layer_ids_in_any_container_is_read_or_refused_never_ignored(ids, accepted):
    pool = _pool(layer_num=1)
    pool.k_buffer, pool.v_buffer = pool.k_buffer[:1], pool.v_buffer[:1]
    pool.model_layer_ids = ids
    for call in (lambda: adapt(pool), lambda: adapt(SimpleNamespace(o=pool), attrs=["o.k_buffer", "o.v_buffer"])):
        if accepted:
            assert call().layer_ids == [3]
        else:
            with pytest.raises(InconsistentLayersError, match="model_layer_ids"):
                call()
