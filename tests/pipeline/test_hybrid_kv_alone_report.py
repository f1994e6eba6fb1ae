"""adapt(dsa_pool, hybrid="error") says, in its report, that the indexer is not included.

That view is the KV alone for FlexKV's SGLang connector, which reads the indexer from the pool itself;
plan() and register() refuse it. Its report used to read like any complete view. Now it names what is
left out, both when the indexer could be offloaded whole and when it could not (a compressed indexer).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import adapt
from flexkv_adapter.errors import PlanError
from flexkv_adapter.flexkv import plan

from ..strategies.hybrids import PS, ROWS, _mla


def _dsa(n: int, compressed: bool) -> object:
    pool = _mla(list(range(n)))
    pool.index_k_with_scale_buffer = [torch.zeros(ROWS // PS, PS * 8, dtype=torch.uint8) for _ in range(n)]
    if compressed:  # compress tails hold one row per request slot: never offloadable with the pages
        pool.index_kpool, pool.index_kpool_compress = 2, True
    return pool


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.booleans())
def test_the_kv_alone_says_so_and_plan_refuses_it(n, compressed):
    pool = _dsa(n, compressed)
    view = adapt(pool, hybrid="error")
    text = str(view.report)
    assert "KV alone" in text and "index_k_with_scale_buffer" in text, text
    with pytest.raises(PlanError, match="holds the KV alone"):
        plan(view)
    with pytest.raises(PlanError, match="holds the KV alone"):
        plan(pool, hybrid="error")


def test_control_the_default_is_offloaded_whole_without_that_note():
    view = adapt(_dsa(2, False))
    assert view.whole is not None and "KV alone" not in str(view.report)
