"""A pool's class and its ``kv_cache_layout`` label, raising, lying or of an odd type: adapt(), plan() and
register() read the pool as what it is, or refuse with an AdapterError, never a raw exception."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt, plan
from flexkv_adapter.flexkv.register import register
from flexkv_adapter.model.views import PoolView

K = [torch.arange(80 * 2 * 8, dtype=torch.float32).add(i).to(torch.bfloat16).view(80, 2, 8) for i in range(2)]
V = [t + 1 for t in K]


K_HND = [t.view(5, 16, 2, 8).transpose(1, 2).contiguous() for t in K]  # [pages, heads, page, dim]
V_HND = [t + 1 for t in K_HND]


def mha_pool(**extra: Any) -> SimpleNamespace:
    """3-D NHD buffers, or 4-D HND ones where the label's characters are 'hnd'."""
    hnd = isinstance(extra.get("kv_cache_layout"), str) and str.__str__(extra["kv_cache_layout"]) == "hnd"
    return SimpleNamespace(k_buffer=K_HND if hnd else K, v_buffer=V_HND if hnd else V, page_size=16, **extra)


class LyingStr(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


LABELS = st.one_of(
    st.sampled_from(["nhd", "hnd", "NHD", "page_major", "", "vectorized_5d", LyingStr("page_major"), LyingStr("nhd")]),
    st.sampled_from([np.array(["nhd", "nhd"]), np.array(["hnd"]), torch.tensor([1, 2]), ["nhd"], 0, b"nhd"]),
)


def outcome(route: Any, pool: object) -> str:
    try:
        return repr(route(pool))
    except AdapterError as exc:
        return f"{type(exc).__name__}: {exc}"


@given(label=LABELS, route=st.sampled_from([adapt, plan]))
def test_kv_cache_layout_reads_only_the_labels_sglang_names(label, route):
    """'nhd' and 'hnd' (HND is then refused as head-major) read as the plain label would, a lying ``==``
    included; anything else is refused by its name."""
    got = outcome(route, mha_pool(kv_cache_layout=label))
    if isinstance(label, str) and str.__str__(label) in ("nhd", "hnd"):
        assert got == outcome(route, mha_pool(kv_cache_layout=str.__str__(label)))
    else:
        assert "Error: " in got and "kv_cache_layout" in got, got


@pytest.mark.parametrize("label", ["page_major", "NHD", np.array(["nhd", "nhd"])])
def test_axes_given_read_a_pool_whatever_its_layout_label(label):
    """axes= names the layout; the label is then not read (its refusal says to pass axes=)."""
    got = outcome(adapt, SimpleNamespace(k_buffer=K, v_buffer=V, page_size=16, kv_cache_layout=label))
    assert "kv_cache_layout" in got
    labelled = SimpleNamespace(k_buffer=K, v_buffer=V, page_size=16, kv_cache_layout=label)
    assert repr(adapt(labelled, axes="N H D")) == repr(adapt(mha_pool(), axes="N H D"))


def test_an_unlabelled_pool_and_an_nhd_pool_read_alike():
    assert repr(adapt(mha_pool())) == repr(adapt(mha_pool(kv_cache_layout="nhd")))


class RaisingClass(SimpleNamespace):
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("__class__ raised")


class ClaimsView(SimpleNamespace):
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return PoolView


@pytest.mark.parametrize("cls", [RaisingClass, ClaimsView])
@pytest.mark.parametrize("route", [adapt, plan, lambda p: register(p, SimpleNamespace(register_to_server=print))])
def test_a_pool_whose_class_raises_or_claims_another_is_refused(cls, route):
    with pytest.raises(AdapterError, match="__class__"):
        route(cls(k_buffer=K, v_buffer=V, page_size=16))


def test_an_attrs_owner_whose_class_raises_is_an_adapter_error_naming_it():
    pool = SimpleNamespace(inner=RaisingClass(k_buffer=K, v_buffer=V, page_size=16))
    with pytest.raises(AdapterError, match="inner"):
        adapt(pool, attrs=["inner.k_buffer", "inner.v_buffer"])


def test_negative_control_a_view_claiming_pool_passes_isinstance():
    """Why the class is read first: isinstance() believes ``__class__``."""
    assert isinstance(ClaimsView(), PoolView)
