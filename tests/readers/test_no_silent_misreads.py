"""No silent misreads by adapt()/plan(): ambiguous K/V pairs, HMA views over shared bytes, copying getters,
nested or unlabelled vLLM dicts, owner metadata in any integer type. Each input that could give a silently
wrong view or registration gives the right elements or the documented AdapterError."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flexkv_adapter import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    MHAView,
    MLAView,
    NotAddressableError,
    adapt,
)
from flexkv_adapter.flexkv import plan

from ..helpers import SGLangLikeMHAPool, distinct
from .test_vllm_layout import views


def test_a_single_head_k_v_pair_is_ambiguous_and_kind_settles_it():
    k, v = distinct((32, 1, 8)), distinct((32, 1, 8), start=5000)
    with pytest.raises(AmbiguousLayoutError, match="kind="):
        adapt([k, v], page_size=16)
    with pytest.raises(AmbiguousLayoutError, match="kind="):
        plan([k, v], page_size=16, tp_size=2, total_kv_heads=2)
    mha = adapt([k, v], page_size=16, kind="mha")
    assert isinstance(mha, MHAView) and mha.layer_ids == [0]
    assert mha.k_buffer[0].data_ptr() == k.data_ptr() and mha.v_buffer[0].data_ptr() == v.data_ptr()
    mla = adapt([k, v], page_size=16, kind="mla")
    assert isinstance(mla, MLAView) and mla.layer_ids == [0, 1]
    p = plan([k, v], page_size=16, kind="mha", tp_size=2, total_kv_heads=2)
    assert (p.num_layer, p.num_kv_heads, p.kv_dim) == (1, 2, 2)


def test_multi_head_k_v_pair_of_one_layer_reads_as_mha():
    k, v = distinct((32, 4, 8)), distinct((32, 4, 8), start=5000)
    view = adapt([k, v], page_size=16)
    assert isinstance(view, MHAView) and view.layer_ids == [0] and view.v_buffer[0].data_ptr() == v.data_ptr()


def _hma(same_object: bool) -> dict[str, torch.Tensor]:
    kv = views("LBNHC", 2, 4, 1, 4, 8)  # MLA rows, 2 slots
    names = list(kv)
    first = kv[names[0]]
    # vLLM 0.33 KV sharing passes the target's tensor object; HMA groups give each layer its own view
    kv["model.layers.2.attn"] = first if same_object else first.as_strided(first.shape, first.stride())
    return kv


def test_hma_views_over_shared_bytes_are_refused_but_kv_sharing_is_accepted():
    with pytest.raises(InconsistentLayersError, match="distinct views"):
        adapt(_hma(False), page_size=4, kind="mla")
    with pytest.raises(InconsistentLayersError, match="distinct views"):
        plan(_hma(False), page_size=4, kind="mla")
    shared = _hma(True)
    view = adapt(shared, page_size=4, kind="mla")
    assert view.layer_ids == [0, 1, 2] and view.kv_buffer[2].data_ptr() == view.kv_buffer[0].data_ptr()
    assert plan(shared, page_size=4, kind="mla").num_layer == 3


class CopyingPool:
    """k_buffer/v_buffer properties that return fresh memory on every read."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.k = [distinct((32, 8, 2)).transpose(1, 2) for _ in range(2)]  # [32, 2, 8], not contiguous
        self.v = [distinct((32, 8, 2), start=900).transpose(1, 2) for _ in range(2)]
        self.page_size = 16

    def _get(self, ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.contiguous() if self.how == "contiguous" else t.clone() for t in ts]

    @property
    def k_buffer(self) -> list[torch.Tensor]:
        return self._get(self.k)

    @property
    def v_buffer(self) -> list[torch.Tensor]:
        return self._get(self.v)


@pytest.mark.parametrize("how", ["contiguous", "clone"])
def test_getters_that_copy_are_refused(how):
    with pytest.raises(NotAddressableError, match="new memory on every read"):
        adapt(CopyingPool(how))
    with pytest.raises(NotAddressableError, match="new memory on every read"):
        plan(CopyingPool(how))


def test_a_copying_whole_tensor_attribute_is_refused():
    class Pool:
        base = distinct((2, 2, 32, 2, 8))

        @property
        def kv_cache(self) -> torch.Tensor:
            return self.base.clone()

    with pytest.raises(NotAddressableError, match="new memory"):
        adapt(Pool(), page_size=16)


def _two_block_dict() -> dict[str, torch.Tensor]:
    return views("LBHNC", 3, 2, 4, 4, 8)  # [B=2, H, N, C]: also reads as per-layer [KV N H D]


@pytest.mark.parametrize(
    "wrap",
    [
        lambda d: SimpleNamespace(kv_caches=d),
        lambda d: SimpleNamespace(kv_cache=d),
        lambda d: list(d.values()),
        lambda d: tuple(d.values()),
    ],
    ids=["pool.kv_caches", "pool.kv_cache", "list", "tuple"],
)
def test_nested_vllm_dicts_get_the_same_ambiguity_check_as_direct_ones(wrap):
    with pytest.raises(AmbiguousLayoutError, match="KV N H D"):
        adapt(_two_block_dict())
    with pytest.raises(AmbiguousLayoutError, match="KV N H D"):
        adapt(wrap(_two_block_dict()))
    with pytest.raises(AmbiguousLayoutError, match="KV N H D"):
        plan(wrap(_two_block_dict()), page_size=4)
    view = adapt(wrap(_two_block_dict()), axes="KV N H D", page_size=4)
    assert isinstance(view, MHAView) and len(view.layer_ids) == 3


def test_adapt_and_plan_agree_on_eight_byte_blocks_of_a_vllm_dict():
    kv = views("LBNHC", 3, 4, 1, 5, 9)  # MLA, 5-token blocks of 9 bf16: 90-byte blocks
    with pytest.raises(NotAddressableError, match="multiple of 8"):
        plan(kv, kind="mla")
    with pytest.raises(NotAddressableError, match="multiple of 8"):
        adapt(kv, kind="mla")


def _mtp_dict() -> dict[str, torch.Tensor]:
    kv = views("LBNHC", 3, 4, 1, 4, 8)
    names = list(kv)
    return {"model.layers.5.attn": kv[names[0]], "model.layers.6.attn": kv[names[1]], "mtp.attn": kv[names[2]]}


def test_unlabelled_vllm_dict_entries_are_ambiguous_and_layer_ids_fix_them():
    with pytest.raises(AmbiguousLayoutError, match="layer_ids="):
        adapt(_mtp_dict(), page_size=4, kind="mla")
    view = adapt(_mtp_dict(), page_size=4, kind="mla", layer_ids=[5, 6, 7])
    assert view.layer_ids == [5, 6, 7]
    with pytest.raises(InconsistentLayersError, match="contradicts"):
        adapt(_mtp_dict(), page_size=4, kind="mla", layer_ids=[6, 5, 7])
    named = views("LBNHC", 2, 4, 1, 4, 8)
    assert adapt(named, page_size=4, kind="mla").layer_ids == [0, 1]


def test_attrs_owner_metadata_is_read_like_a_top_level_pool():
    inner = SGLangLikeMHAPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2)
    inner.start_layer = 10
    holder = SimpleNamespace(inner=inner)
    attrs = ["inner.k_buffer", "inner.v_buffer"]
    with pytest.raises(InconsistentLayersError, match="page_size"):
        adapt(holder, page_size=32, attrs=attrs)
    view = adapt(holder, attrs=attrs)
    assert (view.page_size, view.layer_ids) == (16, [10, 11])


def _numpy_pool(kind: type) -> SGLangLikeMHAPool:
    pool = SGLangLikeMHAPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=1)
    pool.page_size, pool.start_layer, pool.layer_num = kind(16), kind(3), kind(1)  # type: ignore[assignment]
    return pool


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint16, lambda n: torch.tensor(n)])
def test_pool_metadata_in_numpy_or_tensor_integers_is_read(kind):
    with pytest.raises(InconsistentLayersError, match="page_size"):
        adapt(_numpy_pool(kind), page_size=32)
    view = adapt(_numpy_pool(kind))
    assert (view.page_size, view.layer_ids) == (16, [3])


@pytest.mark.parametrize("flag", [True, np.True_, torch.tensor(True), np.array(True)])
def test_bools_of_every_kind_are_not_integers(flag):
    pool = SGLangLikeMHAPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=4, layer_num=1)
    with pytest.raises(AdapterError, match="page_size"):
        adapt(pool, page_size=flag)
    with pytest.raises(AdapterError, match="layer_ids"):
        adapt(pool, layer_ids=[flag])
    pool.page_size = flag  # type: ignore[assignment]
    with pytest.raises(AdapterError, match="page_size"):
        adapt(pool)


def test_a_hybrid_wrapper_whose_sub_pool_property_copies_is_refused():
    def sub() -> SimpleNamespace:
        return SimpleNamespace(k_buffer=[distinct((32, 2, 4))], v_buffer=[distinct((32, 2, 4), start=99)], page_size=16)

    class Wrapper:
        full_attention_layer_id_mapping = {3: 0}  # noqa: RUF012
        mamba_pool = None
        kept = sub()

        @property
        def full_kv_pool(self) -> SimpleNamespace:
            return sub()  # a fresh copy on every read

    with pytest.raises(NotAddressableError, match="new memory"):
        adapt(Wrapper(), hybrid="attention_only")
    Wrapper.full_kv_pool = Wrapper.kept  # type: ignore[assignment,method-assign]  # the negative control
    assert adapt(Wrapper(), hybrid="attention_only").layer_ids == [3]


def test_a_partly_named_dict_checks_the_named_entries_against_layer_ids():
    ts = [distinct((2, 32, 2, 4), start=1000 * i) for i in range(2)]
    pool = {"model.layers.5.attn": ts[0], "mtp.attn": ts[1]}  # one buffer each: not a vLLM 0.33 dict
    with pytest.raises(AmbiguousLayoutError, match="layer_ids="):
        adapt(pool, page_size=16)
    with pytest.raises(InconsistentLayersError, match="holds layer 5"):
        adapt(pool, page_size=16, layer_ids=[6, 7])
    assert adapt(pool, page_size=16, layer_ids=[5, 6]).layer_ids == [5, 6]
