"""adapt(dsa_pool, hybrid="error") says, in its report, that the indexer is not included.

That view is the KV alone for FlexKV's SGLang connector, which reads the indexer from the pool itself;
plan() and register() refuse it. Its report names what is left out. Because that connector registers the
indexer the pool holds, the indexer must pass the same gate as when it is offloaded whole: one that could
not be (a compressed indexer, index rows inside the KV, too few index pages, more index buffers than
layers) is refused, not handed over as "the KV alone".
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt
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
@given(st.integers(1, 4))
def test_the_kv_alone_says_so_and_plan_refuses_it(n):
    pool = _dsa(n, False)
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


def _inside_the_kv(n: int) -> object:
    pool = _dsa(n, False)
    rows = pool.kv_buffer[0].view(torch.uint8).view(-1)  # the first layer's KV bytes, as index rows
    pool.index_k_with_scale_buffer[0] = rows[: ROWS // PS * PS * 8].view(ROWS // PS, PS * 8)
    return pool


def _too_few_pages(n: int) -> object:
    pool = _dsa(n, False)
    pool.index_k_with_scale_buffer = [t[:1] for t in pool.index_k_with_scale_buffer]  # 1 index page for all
    return pool


def _more_buffers_than_layers(n: int) -> object:
    pool = _dsa(n, False)
    pool.index_k_with_scale_buffer = [
        *pool.index_k_with_scale_buffer,
        torch.zeros(ROWS // PS, PS * 8, dtype=torch.uint8),
    ]
    return pool


@pytest.mark.parametrize(
    "make",
    [lambda n: _dsa(n, True), _inside_the_kv, _too_few_pages, _more_buffers_than_layers],
    ids=["compressed", "rows-inside-the-kv", "too-few-pages", "more-buffers-than-layers"],
)
@pytest.mark.parametrize("n", [2, 3])
def test_an_indexer_flexkv_could_not_address_is_refused_not_handed_over(make, n):
    pool = make(n)
    with pytest.raises(AdapterError):
        adapt(pool, hybrid="error")
    with pytest.raises(AdapterError):
        adapt(pool)  # the default refuses it too: one gate for both
