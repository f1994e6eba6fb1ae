"""Renamed attributes, vLLM dicts, plain sequences, and user-registered names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flexkv_adapter import (
    AmbiguousLayoutError,
    MHAView,
    MLAView,
    adapt,
    register_attribute_names,
    unregister_attribute_names,
)

from ..helpers import assert_aliases, distinct

L, N, H, D, PS = 3, 40, 2, 4, 16  # rows 40 -> 32


def _layers(shape, count=L):
    return [distinct(shape, start=1000 * i) for i in range(count)]


@pytest.mark.parametrize(
    ("k_name", "v_name"),
    [("k_cache", "v_cache"), ("key_cache", "value_cache"), ("k_buffers", "v_buffers"), ("k_caches", "v_caches")],
)
def test_renamed_k_and_v_lists(k_name, v_name):
    ks, vs = _layers((N, H, D)), _layers((N, H, D + 2))
    pool = SimpleNamespace(**{k_name: ks, v_name: tuple(vs)}, page_size=PS)
    view = adapt(pool)
    assert isinstance(view, MHAView)
    assert view.report.attributes == (k_name, v_name) and view.report.recognizer == "renamed"
    for i in range(L):
        assert_aliases(view.k_buffer[i], ks[i][:32], ks[i])
        assert_aliases(view.v_buffer[i], vs[i][:32], vs[i])


@pytest.mark.parametrize("name", ["kv_cache", "kv_caches"])
def test_single_attribute_with_mla_rows(name):
    kvs = _layers((N, 1, 12))
    view = adapt(SimpleNamespace(**{name: kvs}, page_size=PS))
    assert isinstance(view, MLAView)
    for i in range(L):
        assert_aliases(view.kv_buffer[i], kvs[i][:32], kvs[i])


@pytest.mark.parametrize("name", ["kv_cache", "kv_caches"])
def test_single_attribute_with_per_layer_kv_pairs(name):
    kvs = _layers((2, N, H, D))
    view = adapt(SimpleNamespace(**{name: kvs}, page_size=PS))
    assert isinstance(view, MHAView)
    for i in range(L):
        assert_aliases(view.k_buffer[i], kvs[i][0, :32], kvs[i])
        assert_aliases(view.v_buffer[i], kvs[i][1, :32], kvs[i])


def test_kv_cache_single_tensor_kv_first():
    kv = distinct((2, L, N, H, D))
    view = adapt(SimpleNamespace(kv_cache=kv, layer_num=L, page_size=PS))
    for i in range(L):
        assert_aliases(view.k_buffer[i], kv[0, i, :32], kv)
        assert_aliases(view.v_buffer[i], kv[1, i, :32], kv)


def test_vllm_dict_orders_layers_by_the_index_in_their_names():
    names = [f"model.layers.{i}.self_attn.attn" for i in (10, 2, 7)]
    tensors = {n: distinct((2, 3, PS, H, D), start=100 * j) for j, n in enumerate(names)}
    with pytest.raises(AmbiguousLayoutError, match="axes='KV P H T D'"):
        adapt(tensors)  # [2, 3, 16, 2, 4] could be NHD (16 tokens, 2 heads) or HND (2 tokens, 16 heads)
    view = adapt(tensors, page_size=PS)
    assert view.layer_ids == [2, 7, 10]
    assert view.report.recognizer == "vllm-dict" and view.page_size == PS
    for i, layer in enumerate([2, 7, 10]):
        src = tensors[f"model.layers.{layer}.self_attn.attn"]
        assert_aliases(view.k_buffer[i], src[0].reshape(3 * PS, H, D), src)
        assert_aliases(view.v_buffer[i], src[1].reshape(3 * PS, H, D), src)


def test_vllm_dict_with_unparseable_names_needs_layer_ids():
    tensors = {"enc.0.layers.1": distinct((2, 3, PS, H, D)), "enc.0.layers.2": distinct((2, 3, PS, H, D))}
    with pytest.raises(AmbiguousLayoutError, match="layer_ids"):
        adapt(tensors, head_num=H)
    view = adapt(tensors, head_num=H, layer_ids=[4, 5])
    assert view.layer_ids == [4, 5]
    assert view.k_buffer[1].data_ptr() == tensors["enc.0.layers.2"].data_ptr()


@pytest.mark.parametrize("container", [list, tuple])
def test_plain_sequence_of_per_layer_tensors(container):
    kvs = container(_layers((2, N, H, D)))
    view = adapt(kvs, page_size=PS)
    assert view.report.recognizer == "sequence" and view.layer_ids == [0, 1, 2]
    for i in range(L):
        assert_aliases(view.k_buffer[i], kvs[i][0, :32], kvs[i])


def test_pair_of_k_and_v_lists():
    ks, vs = _layers((N, H, D)), _layers((N, H, D))
    view = adapt([ks, vs], page_size=PS, start_layer=4)
    assert view.report.recognizer == "kv-pair-lists" and view.layer_ids == [4, 5, 6]
    assert_aliases(view.v_buffer[2], vs[2][:32], vs[2])


def test_user_registered_attribute_names():
    class MyPool:
        def __init__(self):
            self.keys_per_layer = _layers((N, H, D))
            self.values_per_layer = _layers((N, H, D))
            self.latents = _layers((N, 1, 12))
            self.page_size = PS

    register_attribute_names("keys_per_layer", "values_per_layer", family="my-engine")
    try:
        pool = MyPool()
        del pool.latents
        view = adapt(pool)
        assert view.report.recognizer == "my-engine"
        assert_aliases(view.k_buffer[1], pool.keys_per_layer[1][:32], pool.keys_per_layer[1])
    finally:
        unregister_attribute_names("keys_per_layer", "values_per_layer")
    register_attribute_names("latents", kind="mla")
    try:
        view = adapt(MyPool(), attrs=None)
        assert isinstance(view, MLAView) and view.report.attributes == ("latents",)
    finally:
        unregister_attribute_names("latents")


def test_register_attribute_names_validates_its_input():
    with pytest.raises(ValueError, match="one or two"):
        register_attribute_names("a", "b", "c")
    with pytest.raises(ValueError, match="MHA"):
        register_attribute_names("a", "b", kind="mla")


def test_attrs_option_selects_among_several_candidates():
    ks, vs = _layers((N, H, D)), _layers((N, H, D))
    other = _layers((N, H, D))
    pool = SimpleNamespace(k_cache=ks, v_cache=vs, key_cache=other, value_cache=other, page_size=PS)
    with pytest.raises(AmbiguousLayoutError, match="k_cache"):
        adapt(pool)
    view = adapt(pool, attrs=["k_cache", "v_cache"])
    assert view.k_buffer[0].data_ptr() == ks[0].data_ptr()


def test_two_names_for_the_same_bytes_are_not_ambiguous():
    kv = distinct((2, L, N, H, D))
    pool = SimpleNamespace(kv_cache=kv, k_cache=list(kv[0]), v_cache=list(kv[1]), layer_num=L, page_size=PS)
    view = adapt(pool)
    assert view.k_buffer[1].data_ptr() == kv[0, 1].data_ptr()
