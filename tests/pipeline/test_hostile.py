"""Hostile inputs (issue 8): each gives a correct view or an AdapterError, never a wrong view or a traceback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    adapt,
    plan,
)
from flexkv_adapter.cli.samples import _swa_pool

from ..helpers import assert_aliases, distinct

N, H, D, PS = 32, 2, 8, 16


def _t(start: int, shape: tuple[int, ...] = (N, H, D)) -> torch.Tensor:
    return distinct(shape, start=start)


def _kv_layers(n: int, shape: tuple[int, ...] = (N, H, D)) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(_t(10_000 * i, shape), _t(10_000 * i + 5_000, shape)) for i in range(n)]


# 1. two-layer pair ambiguity -------------------------------------------------------------------


@pytest.mark.parametrize("outer, inner", [(list, tuple), (tuple, tuple), (list, list)])
def test_two_layer_kv_pairs_are_never_read_as_k_and_v_lists(outer, inner):
    pairs = outer(inner(p) for p in _kv_layers(2))
    with pytest.raises(AmbiguousLayoutError, match=r"axes='KV L N H D'[\s\S]*axes='L KV N H D'"):
        adapt(pairs, page_size=PS)
    with pytest.raises(AmbiguousLayoutError):  # both readings have two layers: layer_num cannot settle it
        adapt(pairs, page_size=PS, layer_num=2)
    view = adapt(pairs, page_size=PS, axes="L KV N H D")
    assert view.report.reading == "MHA [L KV N H D]"  # the axes that select it again, e.g. in a spec
    pinned = adapt(pairs, page_size=PS, spec={"name": "pairs", "axes": "L KV N H D"})
    assert [t.data_ptr() for t in pinned.tensors()] == [t.data_ptr() for t in view.tensors()]
    for i, (k, v) in enumerate(pairs):
        assert_aliases(view.k_buffer[i], k, k)
        assert_aliases(view.v_buffer[i], v, v)
    lists = adapt(pairs, page_size=PS, axes="KV L N H D")  # the other reading, when asked for
    assert lists.k_buffer[1].data_ptr() == pairs[0][1].data_ptr()


def test_kv_pairs_of_three_layers_are_per_layer_pairs():
    pairs = _kv_layers(3)
    view = adapt(pairs, page_size=PS)
    assert view.report.recognizer == "layer-pairs" and view.layer_ids == [0, 1, 2]
    for i, (k, v) in enumerate(pairs):
        assert_aliases(view.k_buffer[i], k, k)
        assert_aliases(view.v_buffer[i], v, v)


def test_k_and_v_lists_still_work_when_unambiguous():
    ks, vs = [_t(100 * i) for i in range(3)], [_t(100 * i + 50_000) for i in range(3)]
    view = adapt([ks, vs], page_size=PS, layer_num=3)
    assert view.report.recognizer == "kv-pair-lists"
    assert_aliases(view.v_buffer[2], vs[2], vs[2])
    # two layers, but K and V head dims differ: only the [k_list, v_list] reading is consistent
    ks2, vs2 = [_t(i * 1000) for i in range(2)], [_t(i * 1000 + 500, (N, H, 4)) for i in range(2)]
    view = adapt([ks2, vs2], page_size=PS)
    assert view.report.recognizer == "kv-pair-lists"
    assert_aliases(view.v_buffer[1], vs2[1], vs2[1])
    view = adapt([(ks2[0], vs2[0]), (ks2[1], vs2[1])], page_size=PS)  # and the pairs reading for pairs
    assert view.report.recognizer == "layer-pairs"
    assert_aliases(view.k_buffer[1], ks2[1], ks2[1])


def test_k_all_v_all_with_two_layers_is_ambiguous_and_three_is_read():
    k_all, v_all = _t(0, (2, N, H, D)), _t(50_000, (2, N, H, D))
    with pytest.raises(AmbiguousLayoutError, match=r"axes='KV N H D'[\s\S]*axes='KV L N H D'"):
        adapt([k_all, v_all], page_size=PS)
    view = adapt([k_all, v_all], page_size=PS, axes="KV L N H D")
    assert_aliases(view.k_buffer[1], k_all[1], k_all)
    assert_aliases(view.v_buffer[0], v_all[0], v_all)
    view = adapt([k_all, v_all], page_size=PS, axes="KV N H D")  # two per-layer [2, N, H, D] tensors
    assert_aliases(view.v_buffer[0], k_all[1], k_all)
    k3, v3 = _t(0, (3, N, H, D)), _t(50_000, (3, N, H, D))
    view = adapt([k3, v3], page_size=PS)
    assert view.report.recognizer == "kv-pair-tensors" and view.layer_ids == [0, 1, 2]
    assert_aliases(view.v_buffer[2], v3[2], v3)


def test_layer_num_settles_the_pair_reading_where_the_layer_counts_differ():
    # two tensors [3, 2, 16, H, D]: two vLLM >= 0.23 layers [NB, 2, BS, H, D], or K and V of 3 paged layers
    k_all, v_all = _t(0, (3, 2, PS, H, D)), _t(50_000, (3, 2, PS, H, D))
    with pytest.raises(AmbiguousLayoutError, match="axes='KV L P T H D'"):
        adapt([k_all, v_all])
    view = adapt([k_all, v_all], layer_num=3)
    assert view.report.recognizer == "kv-pair-tensors" and view.layer_ids == [0, 1, 2]
    assert_aliases(view.v_buffer[2], v_all[2].reshape(2 * PS, H, D), v_all)
    assert plan([k_all, v_all], layer_num=2, head_num=H).num_layer == 2  # per-layer blocks-first, registered whole


# 2. explicit attrs / spec beat hybrid unwrapping -----------------------------------------------


def test_explicit_attrs_beat_a_hybrid_marker():
    own, other = _kv_layers(1)[0], _kv_layers(2)[1]
    pool = SimpleNamespace(k_buffer=[own[0]], v_buffer=[own[1]], main_pool=SimpleNamespace(k_buffer=[other[0]]))
    view = adapt(pool, page_size=PS, attrs=["k_buffer", "v_buffer"])
    assert_aliases(view.k_buffer[0], own[0], own[0])
    assert any("main_pool" in n for n in view.report.notes)
    view = adapt(pool, page_size=PS, spec={"name": "mine", "attrs": ["k_buffer", "v_buffer"], "axes": "N H D"})
    assert_aliases(view.v_buffer[0], own[1], own[1])


def test_dotted_attrs_read_a_swa_sub_pool():
    pool = _swa_pool()
    view = adapt(pool, attrs=["swa_kv_pool.k_buffer", "swa_kv_pool.v_buffer"])
    swa = pool.swa_kv_pool
    assert len(view.k_buffer) == len(swa.k_buffer)
    for i, k in enumerate(swa.k_buffer):
        assert_aliases(view.k_buffer[i], k[: view.report.aligned_rows], k)


# 3. layer_ids / start_layer on a named dict ----------------------------------------------------


def _named_dict() -> dict[str, torch.Tensor]:
    return {"model.layers.5.attn": _t(0, (2, 3, PS, H, D)), "model.layers.3.attn": _t(9_000, (2, 3, PS, H, D))}


def test_dict_layer_ids_contradicting_the_names_are_refused():
    d = _named_dict()
    with pytest.raises(InconsistentLayersError, match="contradicts the layer indices"):
        adapt(d, page_size=PS, layer_ids=[50, 30])
    view = adapt(d, page_size=PS, layer_ids=[5, 3])  # the dict's order, agreeing with the names
    assert view.layer_ids == [3, 5]
    assert view.k_buffer[0].data_ptr() == d["model.layers.3.attn"].data_ptr()


def test_dict_layer_ids_apply_in_the_dicts_order_when_names_give_none():
    d = {"enc.a": _t(0, (2, 3, PS, H, D)), "enc.b": _t(9_000, (2, 3, PS, H, D))}
    view = adapt(d, page_size=PS, layer_ids=[50, 30])
    assert view.layer_ids == [50, 30]
    assert view.k_buffer[0].data_ptr() == d["enc.a"].data_ptr()


@pytest.mark.parametrize("names", [("model.layers.5.attn", "model.layers.3.attn"), ("enc.a", "enc.b")])
def test_start_layer_on_a_dict_is_refused(names):
    d = {n: _t(i * 9_000, (2, 3, PS, H, D)) for i, n in enumerate(names)}
    with pytest.raises(AdapterError, match="start_layer= does not apply to a dict"):
        adapt(d, page_size=PS, start_layer=4)


@pytest.mark.parametrize("name", ["model.layers.\u0663.attn", "model.layers.\u00b2.attn", "layers." + "9" * 5000])
def test_dict_names_with_odd_digits_need_layer_ids(name):
    d = {name: _t(0, (2, 3, PS, H, D))}
    with pytest.raises(AmbiguousLayoutError, match="layer_ids"):
        adapt(d, page_size=PS)
    assert adapt(d, page_size=PS, layer_ids=[7]).layer_ids == [7]


# 4. every layer's every axis -------------------------------------------------------------------


def test_kv_extent_is_checked_on_every_layer():
    pool = SimpleNamespace(kv_cache=[_t(0, (2, N, H, D)), _t(9_000, (5, N, H, D))])
    with pytest.raises(AdapterError, match=r"kv_cache\[1\]: axis KV has extent 5"):
        adapt(pool, page_size=PS)


def test_vllm_dict_layer_with_five_planes_is_refused_by_adapt_and_plan():
    d = {"layers.0.attn": _t(0, (2, 3, PS, H, D)), "layers.1.attn": _t(9_000, (5, 3, PS, H, D))}
    with pytest.raises(AdapterError):
        adapt(d, page_size=PS)
    with pytest.raises(AdapterError):
        plan(d, page_size=PS)


def test_whole_k_and_v_tensors_must_hold_the_same_layers():
    pool = SimpleNamespace(k_cache=_t(0, (2, N, H, D)), v_cache=_t(9_000, (3, N, H, D)))
    with pytest.raises(AdapterError, match="disagree on the number of layers"):
        adapt(pool, page_size=PS)


# 5. tensors without storage --------------------------------------------------------------------


def _fake(shape: tuple[int, ...]) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.zeros(shape)


@pytest.mark.parametrize(
    "make",
    [
        lambda s: torch.zeros(s, device="meta"),
        _fake,
        lambda s: torch.zeros(s).to_sparse(),
        lambda s: torch.zeros(s[0], s[1] * s[2]).to_sparse_csr(),
        lambda s: torch.zeros(s[0], 0, s[2]),
    ],
    ids=["meta", "fake", "coo", "csr", "empty"],
)
def test_tensors_without_storage_are_refused(make):
    t = make((N, H, D))
    for pool in (SimpleNamespace(k_buffer=[t], v_buffer=[t]), [t, t], {"layers.0": t}, t):
        with pytest.raises(AdapterError, match="nothing there can be offloaded"):
            adapt(pool, page_size=PS)
    with pytest.raises(AdapterError, match="nothing there can be offloaded"):
        plan(SimpleNamespace(k_buffer=[t], v_buffer=[t]), page_size=PS)
