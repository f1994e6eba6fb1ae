"""adapt() on hostile pairings and labels: separate K and V dicts paired by layer or refused, layer ids and
mappings that cannot label the layers, metadata out of range, dtype options, nested tensors. Each input
once gave a wrong view, a report that lied, or a raw exception."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AdapterError, adapt

from ..helpers import assert_aliases, distinct

N, H, D, PS = 32, 2, 4, 16


def _k(i: int) -> torch.Tensor:
    return distinct((N, H, D), torch.float32, 1000 * i)


def _v(i: int) -> torch.Tensor:
    return distinct((N, H, D), torch.float32, 1000 * i + 500)


@pytest.mark.parametrize(
    "k_buffer, v_buffer",
    [
        ({"l.0": 0, "l.1": 1}, {"l.1": 1, "l.2": 2}),  # the names give other layers
        ({"l.1": 1, "l.0": 0}, [1, 0]),  # a dict beside a list in the dict's (unsorted) order
        ({"a": 1, "b": 0}, {"l.0": 0, "l.1": 1}),  # names without ids beside named layers
        ({"a": 1, "b": 0}, {"b": 0, "a": 1}),  # the same names in another order
    ],
)
def test_separate_k_and_v_dicts_are_paired_by_layer_or_refused(k_buffer, v_buffer):
    """K and V given as dicts (or a dict and a list) must pair layer i's K with layer i's V."""
    ks = {i: _k(i) for i in range(3)}
    vs = {i: _v(i) for i in range(3)}

    def build(spec: object, tensors: dict[int, torch.Tensor]) -> object:
        return {n: tensors[i] for n, i in spec.items()} if isinstance(spec, dict) else [tensors[i] for i in spec]

    pool = SimpleNamespace(k_buffer=build(k_buffer, ks), v_buffer=build(v_buffer, vs), page_size=PS)
    for options in ({}, {"layer_ids": [7, 8]}):
        try:
            view = adapt(pool, **options)
        except AdapterError:
            continue
        for k, v in zip(view.k_buffer, view.v_buffer):
            layer = next(i for i, t in ks.items() if t.data_ptr() == k.data_ptr())
            assert v.data_ptr() == vs[layer].data_ptr(), f"layer {layer}'s K is paired with another layer's V"


def test_separate_dicts_with_the_same_layer_names_pair_by_name():
    pool = SimpleNamespace(k_buffer={"l.1": _k(1), "l.0": _k(0)}, v_buffer={"l.0": _v(0), "l.1": _v(1)}, page_size=PS)
    view = adapt(pool)
    assert view.layer_ids == [0, 1]
    for i in (0, 1):
        assert_aliases(view.k_buffer[i], pool.k_buffer[f"l.{i}"], pool.k_buffer[f"l.{i}"])
        assert_aliases(view.v_buffer[i], pool.v_buffer[f"l.{i}"], pool.v_buffer[f"l.{i}"])


@pytest.mark.parametrize("attr, value", [("page_size", 0), ("page_size", -16), ("start_layer", -1)])
def test_pool_metadata_out_of_range_is_refused(attr, value):
    """pool.page_size=0 raised ZeroDivisionError; -16 gave num_blocks=-3; start_layer=-1 gave layer id -1."""
    pool = SimpleNamespace(k_buffer=[_k(0), _k(1)], v_buffer=[_v(0), _v(1)], **{"page_size": PS, attr: value})
    with pytest.raises(AdapterError, match=f"pool.{attr}"):
        adapt(pool)


def _swa_without_model_ids() -> object:
    from flexkv_adapter.cli.samples import _swa_pool

    pool = _swa_pool()
    del pool.full_kv_pool.model_layer_ids  # SGLang's sub-pools have none: the wrapper's mapping gives the ids
    return pool


def test_hybrid_report_states_the_mapped_layer_ids():
    view = adapt(_swa_without_model_ids(), hybrid="attention_only")
    assert view.layer_ids == [1, 4]
    assert list(view.report.layer_ids) == [1, 4], "the report must name the layers the view exposes"


@pytest.mark.parametrize("options", [{"layer_ids": [7, 8]}, {"start_layer": 5}])
def test_hybrid_layer_options_contradicting_the_mapping_are_refused(options):
    with pytest.raises(AdapterError, match="layers_mapping|mapping"):
        adapt(_swa_without_model_ids(), hybrid="attention_only", **options)


def test_hybrid_layer_ids_agreeing_with_the_mapping_are_accepted():
    view = adapt(_swa_without_model_ids(), hybrid="attention_only", layer_ids=[1, 4])
    assert view.layer_ids == [1, 4] and list(view.report.layer_ids) == [1, 4]


@pytest.mark.parametrize("ids", [[3, 3], [0, 1, 2], [5], [1, 1, 2]])
def test_model_layer_ids_that_cannot_label_the_layers_are_refused(ids):
    """Duplicates were taken as ids ([3, 3]); a wrong count was silently replaced by 0..n-1."""
    pool = SimpleNamespace(k_buffer=[_k(0), _k(1)], v_buffer=[_v(0), _v(1)], page_size=PS, model_layer_ids=ids)
    with pytest.raises(AdapterError, match="model_layer_ids"):
        adapt(pool)


def test_model_layer_ids_as_a_range_label_the_layers():
    pool = SimpleNamespace(k_buffer=[_k(0), _k(1)], v_buffer=[_v(0), _v(1)], page_size=PS, model_layer_ids=range(4, 6))
    assert adapt(pool).layer_ids == [4, 5]


def test_dtype_option_does_not_unify_layers_stored_in_different_dtypes():
    """fp16 bytes of one layer were exposed as bf16 beside bf16 layers once dtype=torch.bfloat16 was given."""
    ks = [torch.zeros(N, H, D, dtype=torch.bfloat16), torch.zeros(N, H, D, dtype=torch.float16)]
    vs = [torch.zeros(N, H, D, dtype=torch.bfloat16) for _ in range(2)]
    pool = SimpleNamespace(k_buffer=ks, v_buffer=vs, page_size=PS)
    with pytest.raises(AdapterError, match="float16"):
        adapt(pool, dtype=torch.bfloat16)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("as_list", [False, True])
def test_nested_tensors_are_refused(as_list):
    """A strided nested tensor passed the storage checks and raised RuntimeError from .shape."""
    nested = torch.nested.nested_tensor([_k(0), _k(1)])
    pool = SimpleNamespace(k_buffer=[nested] if as_list else nested, v_buffer=[nested] if as_list else nested)
    with pytest.raises(AdapterError, match="nested"):
        adapt(pool, page_size=PS)


def test_one_layer_named_only_in_v_is_labelled_with_its_name():
    pool = SimpleNamespace(k_buffer=[_k(0)], v_buffer={"model.layers.1.attn.v": _v(0)}, page_size=PS)
    assert adapt(pool).layer_ids == [1]


def test_one_layer_whose_k_and_v_names_differ_is_refused():
    pool = SimpleNamespace(k_buffer={"layers.0": _k(0)}, v_buffer={"layers.1": _v(0)}, page_size=PS)
    with pytest.raises(AdapterError, match="names layers"):
        adapt(pool)


@pytest.mark.parametrize(
    "mapping",
    [
        {1: (0, False), 4: (0, False), 0: (0, True), 2: (1, True), 3: (2, True)},  # two layers at index 0
        {1: (0, False), 4: (3, False), 0: (0, True), 2: (1, True), 3: (2, True)},  # index 3 of a 2-layer pool
    ],
)
def test_swa_mapping_whose_indices_do_not_enumerate_the_sub_pool_is_refused(mapping):
    """Layer 4 was labelled as full_kv_pool's index 1 although the mapping put it at index 0 (or 3)."""
    pool = _swa_without_model_ids()
    pool.layers_mapping = mapping
    with pytest.raises(AdapterError, match="layers_mapping"):
        adapt(pool, hybrid="attention_only")


@pytest.mark.parametrize("mapping", [{2: 0, 5: 0}, {2: 0, 5: 3}])
def test_linear_hybrid_mapping_whose_indices_do_not_enumerate_the_sub_pool_is_refused(mapping):
    from flexkv_adapter.cli.samples import _hybrid_linear_pool

    pool = _hybrid_linear_pool()
    del pool.full_kv_pool.model_layer_ids
    pool.full_attention_layer_id_mapping = mapping
    with pytest.raises(AdapterError, match="full_attention_layer_id_mapping"):
        adapt(pool, hybrid="attention_only")


def test_dtype_option_contradicting_pool_dtype_is_refused():
    """bf16 bytes were exposed as float16 (same itemsize, so not even a warning)."""
    ks, vs = [torch.zeros(N, H, D, dtype=torch.bfloat16)], [torch.zeros(N, H, D, dtype=torch.bfloat16)]
    pool = SimpleNamespace(k_buffer=ks, v_buffer=vs, page_size=PS, dtype=torch.bfloat16)
    with pytest.raises(AdapterError, match="pool.dtype"):
        adapt(pool, dtype=torch.float16)


def test_dtype_option_may_name_the_pool_dtype_or_its_store_dtype():
    ks, vs = [torch.zeros(N, H, D, dtype=torch.uint8)], [torch.zeros(N, H, D, dtype=torch.uint8)]
    pool = SimpleNamespace(k_buffer=ks, v_buffer=vs, page_size=PS, dtype=torch.float8_e4m3fn, store_dtype=torch.uint8)
    assert adapt(pool, dtype=torch.float8_e4m3fn).dtype == torch.float8_e4m3fn
    assert adapt(pool, dtype=torch.uint8).dtype == torch.uint8


@pytest.mark.parametrize("options", [{"start_layer": 0}, {"layer_ids": [0, 1]}])
def test_layer_options_contradicting_model_layer_ids_are_refused(options):
    """start_layer=0 silently replaced model_layer_ids [4, 5] by [0, 1]."""
    pool = SimpleNamespace(k_buffer=[_k(0), _k(1)], v_buffer=[_v(0), _v(1)], page_size=PS, model_layer_ids=[4, 5])
    with pytest.raises(AdapterError, match="model_layer_ids"):
        adapt(pool, **options)
    agreeing = {"start_layer": 4} if "start_layer" in options else {"layer_ids": [4, 5]}
    assert adapt(pool, **agreeing).layer_ids == [4, 5]


@pytest.mark.parametrize("sub, ids", [("full_kv_pool", [1, 4]), ("swa_kv_pool", [0, 2, 3])])
@pytest.mark.parametrize("own_ids", [True, False])
def test_explicit_attrs_into_a_hybrid_sub_pool_take_its_layer_ids(sub, ids, own_ids):
    """attrs=["full_kv_pool.k_buffer", ...] labelled layers 1 and 4 as 0 and 1."""
    from flexkv_adapter.cli.samples import _swa_pool

    pool = _swa_pool()
    if not own_ids:  # SGLang's sub-pools: only the wrapper's layers_mapping knows the ids
        del pool.full_kv_pool.model_layer_ids, pool.swa_kv_pool.model_layer_ids
    view = adapt(pool, attrs=[f"{sub}.k_buffer", f"{sub}.v_buffer"])
    assert view.layer_ids == ids and list(view.report.layer_ids) == ids
    with pytest.raises(AdapterError):
        adapt(pool, attrs=[f"{sub}.k_buffer", f"{sub}.v_buffer"], layer_ids=list(range(len(ids))))


def test_two_attribute_families_with_the_same_bytes_but_other_layer_ids_are_ambiguous():
    """k_buffer lists (ids 0, 1) and key_cache dicts naming layers 5, 6 were merged as one reading: ids 0, 1."""
    ks, vs = [_k(0), _k(1)], [_v(0), _v(1)]
    pool = SimpleNamespace(
        k_buffer=ks,
        v_buffer=vs,
        key_cache={"layers.5": ks[0], "layers.6": ks[1]},
        value_cache={"layers.5": vs[0], "layers.6": vs[1]},
        page_size=PS,
    )
    with pytest.raises(AdapterError, match="readings"):
        adapt(pool)
    assert adapt(pool, attrs=["key_cache", "value_cache"]).layer_ids == [5, 6]


def test_two_dicts_whose_names_give_no_layer_ids_pair_only_with_the_same_keys():
    """Names with two integers give no id; the dicts' orders differed and K of layer 1 sat beside V of layer 0."""
    pool = SimpleNamespace(
        k_buffer={"m.layers.1.k.0": _k(1), "m.layers.0.k.0": _k(0)},
        v_buffer={"m.layers.0.v.0": _v(0), "m.layers.1.v.0": _v(1)},
        page_size=PS,
    )
    with pytest.raises(AdapterError, match="k_buffer"):
        adapt(pool, layer_ids=[1, 0])
    same = SimpleNamespace(k_buffer={"a": _k(1), "b": _k(0)}, v_buffer={"a": _v(1), "b": _v(0)}, page_size=PS)
    view = adapt(same, layer_ids=[1, 0])
    assert view.layer_ids == [1, 0] and view.v_buffer[0].data_ptr() == same.v_buffer["a"].data_ptr()
