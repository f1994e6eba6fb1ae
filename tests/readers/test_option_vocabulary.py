"""One keyword vocabulary for adapt(), plan() and register(): a misspelt or misplaced keyword is refused by the
entry point it was given to, with the keyword meant and the entry point that takes it; never ignored."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt, plan
from flexkv_adapter.flexkv.register import register
from flexkv_adapter.readers.options import ENTRY_KEYWORDS

POOL = SimpleNamespace(
    k_buffer=[torch.zeros(80, 2, 8, dtype=torch.bfloat16) for _ in range(2)],
    v_buffer=[torch.ones(80, 2, 8, dtype=torch.bfloat16) for _ in range(2)],
    page_size=16,
)
VIEW = adapt(POOL)
CLIENT = SimpleNamespace(register_to_server=lambda *a, **k: None)
ROUTES: dict[str, Any] = {
    "adapt": lambda **kw: adapt(POOL, **kw),
    "plan": lambda **kw: plan(VIEW, **kw),
    "register": lambda **kw: register(VIEW, CLIENT, **kw),
    "register a plan": lambda **kw: register(plan(VIEW), CLIENT, **kw),
}
EVERY = sorted(set().union(*ENTRY_KEYWORDS.values()))


@given(route=st.sampled_from(sorted(ROUTES)), keyword=st.sampled_from(EVERY), data=st.data())
def test_a_misspelt_keyword_names_the_one_meant_and_the_entry_point_that_takes_it(route, keyword, data):
    cut = data.draw(st.integers(0, len(keyword) - 1))
    typo = keyword[:cut] + keyword[cut + 1 :]
    if typo in EVERY:
        return  # dropping a letter made another keyword
    entry = route.split()[0]
    with pytest.raises(AdapterError, match=rf"unknown {entry}\(\) keyword") as err:
        ROUTES[route](**{typo: 1})
    hint = str(err.value).split("did you mean ", 1)[1].split("?", 1)[0]
    meant = [part.split(",")[0].strip("'") for part in hint.split(" or ")]
    assert keyword in meant, str(err.value)
    taker = next(e for e, names in ENTRY_KEYWORDS.items() if keyword in names)
    assert (keyword in ENTRY_KEYWORDS[entry]) or f"{keyword}, a {taker}() keyword" in hint, str(err.value)


@pytest.mark.parametrize(
    ("route", "keyword", "taker"),
    [("adapt", "tp_size", "plan"), ("adapt", "attempts", "register"), ("plan", "interval_s", "register")],
)
def test_a_keyword_given_to_an_entry_point_that_does_not_take_it_names_the_one_that_does(route, keyword, taker):
    with pytest.raises(AdapterError, match=rf"unknown {route}\(\) keyword\(s\) '{keyword}' \(a {taker}\(\) keyword\)"):
        ROUTES[route](**{keyword: 1})


def test_a_plan_of_a_view_with_a_typo_is_not_told_it_is_already_adapted():
    with pytest.raises(AdapterError) as err:
        plan(VIEW, tp_sise=2)
    assert "already adapted" not in str(err.value) and "tp_size" in str(err.value)


def test_negative_control_the_correctly_spelt_keywords_are_taken(fake_flexkv):
    assert plan(VIEW, tp_size=1) is not None
    assert register(plan(VIEW), CLIENT, attempts=1, interval_s=0.0) is not None
    assert adapt(POOL, page_size=16) is not None
