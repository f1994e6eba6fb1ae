"""A hybrid wrapper's page_size against its attention sub-pool's, on every way in.

The wrapper's own page_size was never read: a wrapper saying 16 over a sub-pool saying 32 adapted with 32
(or the reverse with 16), unwrapped or through attrs= into the sub-pool. Contradicting metadata is an error.
"""

from __future__ import annotations

import pytest

from flexkv_adapter import InconsistentLayersError, adapt
from flexkv_adapter.cli.samples import _swa_pool

ATTRS = ["full_kv_pool.k_buffer", "full_kv_pool.v_buffer"]


@pytest.mark.parametrize("which", ["wrapper", "sub-pool"])
@pytest.mark.parametrize("attrs", [None, ATTRS], ids=["unwrapped", "attrs"])
def test_a_wrapper_page_size_that_contradicts_its_sub_pool_is_refused(which, attrs):
    pool = _swa_pool()
    target = pool if which == "wrapper" else pool.full_kv_pool
    target.page_size = 2 * pool.full_kv_pool.page_size
    with pytest.raises(InconsistentLayersError, match="contradicts full_kv_pool.page_size"):
        adapt(pool, hybrid="attention_only", attrs=attrs)
    control = _swa_pool()  # agreeing metadata adapts, with the wrapper's layer ids
    view = adapt(control, hybrid="attention_only", attrs=attrs)
    assert view.layer_ids == [1, 4] and view.page_size == control.page_size
    assert view.k_buffer[0].data_ptr() == control.full_kv_pool.k_buffer[0].data_ptr()
