"""Engine classes are served only where their table serves them, on every way into adapt() and plan().

The main suite has no SGLang: SGLang's classes are built by name (their module under ``sglang.srt.``) around
the attributes of an SGLang-like pool, so that without the table they would be adapted: the refusal comes
from the table, and the same object under a user's class is adapted (negative control).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import UnsupportedFeatureError, adapt, plan
from flexkv_adapter.model.sglang_features import SGLANG
from flexkv_adapter.model.sglang_pool_features import POOL
from flexkv_adapter.readers.engine_objects import SUB_POOLS, refuse_unproven

from ..helpers import SGLangLikeMHAPool

MODULE = "sglang.srt.mem_cache.memory_pool"
POOL_ROWS = SGLANG.of_kind(POOL)


def engine_pool(name: str, module: str = MODULE, base: type = SGLangLikeMHAPool) -> Any:
    """An SGLang-like MHA pool (k_buffer/v_buffer, 2 layers, page 16) whose class is SGLang's ``name``."""
    cls = type(name, (base,), {"__module__": module})
    pool: Any = object.__new__(cls)
    SGLangLikeMHAPool.__init__(pool, size=64, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2)
    return pool


class Wrapper:
    """A user's wrapper holding a sub-pool under one of SGLang's sub-pool names."""

    def __init__(self, attr: str, sub: Any) -> None:
        setattr(self, attr, sub)


WAYS = {
    "adapt": lambda p: adapt(p),
    "adapt-attrs": lambda p: adapt(p, attrs=["k_buffer", "v_buffer"]),
    "adapt-spec": lambda p: adapt(p, spec={"name": "mine", "attrs": ["k_buffer", "v_buffer"], "axes": "N H D"}),
    "adapt-hybrid": lambda p: adapt(p, hybrid="attention_only"),
    "plan": lambda p: plan(p),
}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", ["PageInterleaveMHATokenToKVPool", "NoOpMHATokenToKVPool", "MHATokenToKVPoolHost"])
def test_a_refused_class_is_refused_on_every_way_in_naming_it_and_why(way, name):
    with pytest.raises(UnsupportedFeatureError, match=f"{name} is a .*refused: see docs/sglang.md#features"):
        WAYS[way](engine_pool(name))


@pytest.mark.parametrize("way", WAYS)
def test_negative_control_the_same_pool_under_a_users_class_is_adapted(way):
    WAYS[way](engine_pool("PageInterleaveMHATokenToKVPool", module="my_serving.pools"))


@pytest.mark.parametrize("way", WAYS)
def test_an_unclassified_engine_class_is_refused_by_default(way):
    pool = engine_pool("FancyNewTokenToKVPool", module="sglang.srt.mem_cache.fancy_pool")
    with pytest.raises(UnsupportedFeatureError, match="FancyNewTokenToKVPool is a KV pool class of SGLang 0.5.23 "
                       "that flexkv_adapter has not classified.*docs/sglang.md#features"):  # fmt: skip
        WAYS[way](pool)


def test_a_users_subclass_of_a_served_engine_class_is_refused_whatever_its_name():
    served = type("MHATokenToKVPool", (SGLangLikeMHAPool,), {"__module__": MODULE})
    with pytest.raises(UnsupportedFeatureError, match=r"my_serving\.pools\.MHATokenToKVPool is a KV pool class"):
        adapt(engine_pool("MHATokenToKVPool", module="my_serving.pools", base=served))
    assert adapt(engine_pool("MHATokenToKVPool")).layer_ids == [0, 1]  # SGLang's own class is served


@pytest.mark.parametrize("attr", SUB_POOLS)
def test_a_sub_pool_is_decided_by_the_table_where_it_sits(attr):
    with pytest.raises(UnsupportedFeatureError, match=rf"Wrapper\.{attr} \(PageInterleaveMLATokenToKVPool\) is a"):
        refuse_unproven(Wrapper(attr, engine_pool("PageInterleaveMLATokenToKVPool")))
    refuse_unproven(Wrapper(attr, engine_pool("MHATokenToKOnlyPool")))  # refused alone, read inside a wrapper
    refuse_unproven(Wrapper(attr, engine_pool("MHATokenToKVPool")))


@given(
    row=st.sampled_from(POOL_ROWS),
    attr=st.sampled_from(("", *SUB_POOLS)),
    module=st.sampled_from([MODULE, "sglang.srt.hardware_backend.npu.memory_pool_npu", "sglang.srt.x"]),
    users=st.booleans(),
)
def test_every_pool_row_decides_its_class_at_the_top_and_below_a_wrapper(row, attr, module, users):
    pool = engine_pool(row.name, module=module)
    if users:  # the engine's class, subclassed by a user under the same name
        pool = engine_pool(row.name, module="my_serving.pools", base=type(pool))
    obj = Wrapper(attr, pool) if attr else pool
    allowed = not users and (row.verdict == "served" or (attr != "" and row.nested))
    try:
        refuse_unproven(obj)
    except UnsupportedFeatureError as exc:
        assert not allowed and type(pool).__name__ in str(exc) and "docs/sglang.md#features" in str(exc)
    else:
        assert allowed


def _kv(a: str) -> list[str]:
    return [f"{a}.k_buffer", f"{a}.v_buffer"]


PATH_WAYS = {
    "adapt-attrs": lambda p, a: adapt(p, attrs=_kv(a)),
    "adapt-spec": lambda p, a: adapt(p, spec={"name": "s", "attrs": _kv(a), "axes": "N H D"}),
    "plan-attrs": lambda p, a: plan(p, attrs=_kv(a)),
}


def nest(path: str, leaf: Any) -> Any:
    """``leaf`` under a user's objects at the dotted ``path``."""
    for part in reversed(path.split(".")):
        leaf = Wrapper(part, leaf)
    return leaf


@pytest.mark.parametrize("way", PATH_WAYS)
@pytest.mark.parametrize("path", ["inner", "main_pool", "full_kv_pool.full_kv_pool", "a.b.c"])
def test_a_refused_pool_the_kv_is_read_from_through_attrs_is_refused(way, path):
    pool = nest(path, engine_pool("PageInterleaveMHATokenToKVPool"))
    with pytest.raises(UnsupportedFeatureError, match=rf"Wrapper\.{path} \(PageInterleaveMHATokenToKVPool\) is a"):
        PATH_WAYS[way](pool, path)


@pytest.mark.parametrize("way", PATH_WAYS)
def test_negative_control_the_same_path_to_a_users_pool_is_adapted(way):
    PATH_WAYS[way](nest("a.b", engine_pool("PageInterleaveMHATokenToKVPool", module="my_serving.pools")), "a.b")


def test_a_refused_pool_two_sub_pool_levels_down_is_refused():
    pool = nest("full_kv_pool.full_kv_pool", engine_pool("NoOpMHATokenToKVPool"))
    with pytest.raises(UnsupportedFeatureError, match=r"full_kv_pool\.full_kv_pool \(NoOpMHATokenToKVPool\)"):
        refuse_unproven(pool)
