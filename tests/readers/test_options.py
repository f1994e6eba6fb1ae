"""adapt()/plan() options that name a choice (kind=, hybrid=) are judged by the characters they hold.

An array or a hostile str subclass used to escape as a raw ValueError (numpy's truth value) or pass as
itself; every such value is an AdapterError naming the option, or the plain string it spells.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt, plan

from ..helpers import SGLangLikeMHAPool


class Raising(str):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("== raised")

    __hash__ = str.__hash__


class Lying(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


def pool() -> SGLangLikeMHAPool:
    return SGLangLikeMHAPool(size=48, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2)


ALLOWED = {"mha", "mla", "error", "attention_only"}
ODD = st.one_of(
    st.builds(lambda v: np.array(v), st.lists(st.sampled_from(["mha", "mla", "error"]), min_size=0, max_size=3)),
    st.builds(np.array, st.sampled_from(["mha", "error"])),
    st.builds(Lying, st.text(max_size=5).filter(lambda s: s not in ALLOWED)),  # == says yes, the text says no
    st.integers(),
    st.none().map(lambda _: b"mha"),
)


@pytest.mark.parametrize("route", [adapt, plan])
@pytest.mark.parametrize("option", ["kind", "hybrid"])
@given(value=ODD)
def test_a_choice_that_is_not_a_plain_allowed_string_is_an_adapter_error(route, option, value):
    with pytest.raises(AdapterError, match=f"{option} must be one of"):
        route(pool(), **{option: value})


@pytest.mark.parametrize("route", [adapt, plan])
def test_a_str_subclass_is_read_by_its_characters(route):
    assert route(pool(), kind=Raising("mha")).kind == "mha"
    with pytest.raises(AdapterError, match="kind must be one of"):
        route(pool(), kind=Raising("gqa"))
