"""Hostile inputs (issue 8), part 2: raising attributes, byte buffers, hybrid metadata, option types -> AdapterError."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flexkv_adapter import (
    AdapterError,
    InconsistentLayersError,
    adapt,
    register_attribute_names,
)

from ..helpers import distinct

N, H, D, PS = 32, 2, 8, 16


def _t(start: int, shape: tuple[int, ...] = (N, H, D)) -> torch.Tensor:
    return distinct(shape, start=start)


def _kv_layers(n: int, shape: tuple[int, ...] = (N, H, D)) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(_t(10_000 * i, shape), _t(10_000 * i + 5_000, shape)) for i in range(n)]


# B. raising attributes, byte-buffer geometry, hybrid metadata, option types ---------------------


@pytest.mark.parametrize(
    "attr",
    [
        "page_size",
        "head_num",
        "dtype",
        "kv_cache_layout",
        "full_kv_pool",
        "main_pool",
        "register_mapping",
        "k_buffer",
        "kv_cache",
        "k_scale_buffer",
        "model_layer_ids",
    ],
)
def test_an_attribute_that_raises_is_named(attr):
    def boom(self):
        raise RuntimeError("not initialised")

    cls = type("Pool", (), {attr: property(boom)})
    pool = cls()
    if attr not in ("k_buffer",):
        pool.k_buffer, pool.v_buffer = [_t(0)], [_t(5_000)]
    else:
        pool.kv_cache = [_t(0, (2, N, H, D))]
    with pytest.raises(AdapterError, match=f"Pool.{attr} raised RuntimeError"):
        adapt(pool, page_size=PS)


def test_a_mapping_whose_items_raise_is_an_adapter_error():
    class Broken(dict):
        def items(self):
            raise RuntimeError("broken")

    with pytest.raises(AdapterError, match="items\\(\\) raised RuntimeError"):
        adapt(Broken({"layers.0": _t(0, (2, 3, PS, H, D))}), page_size=PS)


def test_a_recursive_getattr_is_an_adapter_error():
    class Recursive:
        def __getattr__(self, name):
            return getattr(self, name)

    with pytest.raises(AdapterError, match="raised RecursionError"):
        adapt(Recursive(), page_size=PS)


_BUF = torch.zeros(4096, dtype=torch.uint8)


@pytest.mark.parametrize(
    "buf, shape, offset",
    [
        (_BUF, (-2, -2, 2, 16, 2, 8), 0),  # two negative sizes multiplying to a positive
        (_BUF, (2, 2, -1, 2, 8), 8000),  # -1 with an offset past the end
        (_BUF, (2, 2, 16, 2, 8), 1.5),  # float offset
        (_BUF, (2, 2, 16, 2, 8), True),  # boolean offset
        (_BUF, 5, 0),  # not a sequence
        (_BUF, ("a", 2, 16, 2, 8), 0),  # string dims
        (_BUF, (2, 2, 0, 2, 8), 0),  # zero size
        (_BUF, (2, -1, -1, 2, 8), 0),  # two -1
        (_BUF[1:], (2, 2, -1, 2, 8), 0),  # storage offset not a multiple of float32's size
        (_BUF, (2, 2, 16, 2, 8), 2),  # offset not a multiple of float32's size
        (_BUF, (2, 2, 64, 2, 8), 0),  # more than the buffer holds
    ],
)
def test_byte_buffer_geometry_edge_cases(buf, shape, offset):
    with pytest.raises(AdapterError):
        adapt(buf, page_size=PS, shape=shape, offset=offset, dtype=torch.float32, axes="L KV N H D")


def test_byte_buffer_with_a_valid_offset_still_works():
    buf = torch.zeros(8192, dtype=torch.uint8)
    view = adapt(buf, page_size=PS, shape=(2, 2, -1, 2, 8), offset=64, dtype=torch.float32, axes="L KV N H D")
    assert view.k_buffer[0].data_ptr() == buf.data_ptr() + 64 and view.num_blocks == 1


def _full() -> SimpleNamespace:
    return SimpleNamespace(k_buffer=[_t(0)], v_buffer=[_t(5_000)])


@pytest.mark.parametrize(
    "pool",
    [
        SimpleNamespace(full_kv_pool=_full(), swa_kv_pool=_full(), layers_mapping={0: 5}),
        SimpleNamespace(full_kv_pool=_full(), swa_kv_pool=_full(), layers_mapping={"a": (0, False)}),
        SimpleNamespace(full_kv_pool=_full(), swa_kv_pool=_full(), layers_mapping={0: (0, "no")}),
        SimpleNamespace(full_kv_pool=_full(), full_attention_layer_id_mapping={0: "a", 1: 2}),
        SimpleNamespace(full_kv_pool=_full(), full_attention_layer_id_mapping={None: 0}),
        SimpleNamespace(full_kv_pool=_full(), mamba_pool=SimpleNamespace(mamba_cache=5, mamba_layer_ids="x")),
        SimpleNamespace(main_pool=SimpleNamespace(k_buffer=[_t(0)], v_buffer=[_t(1)], model_layer_ids=[1.5])),
    ],
)
def test_malformed_hybrid_metadata_is_an_adapter_error(pool):
    with pytest.raises(AdapterError):
        adapt(pool, page_size=PS, hybrid="attention_only")


@pytest.mark.parametrize("ids", [[1.5], [True], [-1], ["0"]])
def test_malformed_model_layer_ids_are_refused(ids):
    pool = SimpleNamespace(k_buffer=[_t(0)], v_buffer=[_t(5_000)], model_layer_ids=ids)
    with pytest.raises(InconsistentLayersError, match="model_layer_ids"):
        adapt(pool, page_size=PS)


def test_mamba_cache_without_dict_is_reported_not_enumerated():
    pool = SimpleNamespace(full_kv_pool=_full(), mamba_pool=SimpleNamespace(mamba_cache=5, mamba_layer_ids=[1]))
    view = adapt(pool, page_size=PS, hybrid="attention_only")
    assert [g.name for g in view.side_groups] == ["mamba"] and view.side_groups[0].tensors == ()


@pytest.mark.parametrize(
    "options",
    [
        {"layer_ids": ["a"]},
        {"layer_ids": 5},
        {"layer_ids": [1.5]},
        {"layer_ids": [True]},
        {"layer_ids": [0, 0]},
        {"start_layer": "abc"},
        {"start_layer": True},
        {"start_layer": -1},
        {"attrs": [1]},
        {"attrs": ["k_buffer", "v_buffer", "x"]},
        {"attrs": ["not a name"]},
        {"axes": 123},
        {"axes": "L Q N H D"},
        {"spec": 123},
        {"spec": object()},
        {"hybrid": "bogus"},
        {"kind": "MHA"},
        {"layer_num": True},
        {"head_num": 2.0},
        {"dtype": "bfloat16"},
        {"shape": "2,2"},
        {"shape": [torch.tensor([1, 2]), 2, 16, 2, 8]},
        {"offset": -8},
        {"page_size": True},
        {"page_size": "16"},
        {"bogus_option": 1},
    ],
)
def test_option_types_are_checked_at_the_boundary(options):
    pool = SimpleNamespace(k_buffer=[_t(0)], v_buffer=[_t(5_000)])
    page_size = options.pop("page_size", PS)
    with pytest.raises(AdapterError):
        adapt(pool, page_size, **options)


def test_integers_that_are_not_python_ints_are_accepted():
    pool = SimpleNamespace(k_buffer=[_t(0)], v_buffer=[_t(5_000)])
    view = adapt(pool, np.int64(PS), layer_ids=[np.int32(7)], head_num=torch.tensor(H))
    assert view.layer_ids == [7] and view.page_size == PS and type(view.page_size) is int


def test_register_attribute_names_checks_kind():
    for kind in ("MHA", "gqa", 1):
        with pytest.raises(AdapterError, match="kind must be"):
            register_attribute_names("keys", "values", kind=kind)
