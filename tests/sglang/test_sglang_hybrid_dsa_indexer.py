"""SGLang 0.5.23's HybridLinearKVPool over a DSA child (use_dsa=True): its indexer is named, never dropped.

The wrapper exposes only get_index_k_with_scale_buffer(); the buffers live in full_kv_pool. Once,
hybrid="attention_only" listed the Mamba state alone and handed out the KV without
saying that the DSA indexer the attention layers read was not offloaded either.
"""

from __future__ import annotations

import logging

import pytest

from flexkv_adapter import adapt
from flexkv_adapter.flexkv import plan
from flexkv_adapter.model.hybrid import HybridPoolError

from .pools import hybrid_linear


def test_attention_only_lists_the_dsa_childs_indexer():
    pool = hybrid_linear(True, dsa=True)
    index = [t for t in pool.full_kv_pool.index_k_with_scale_buffer if t.numel()]
    logging.disable(logging.WARNING)
    try:
        view = adapt(pool, hybrid="attention_only")
        plan(pool, hybrid="attention_only")  # the same pipeline: the KV registered, the rest listed
    finally:
        logging.disable(logging.NOTSET)
    listed = {t.data_ptr() for g in view.side_groups if g.name == "index_k_with_scale_buffer" for t in g.tensors}
    assert index and listed == {t.data_ptr() for t in index}
    assert "index_k_with_scale_buffer" in str(view.report)


def test_the_default_refusal_names_the_indexer():
    with pytest.raises(HybridPoolError, match="index_k_with_scale_buffer"):
        adapt(hybrid_linear(True, dsa=True))
