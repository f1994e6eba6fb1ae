"""The SGLang plugin never hands FlexKV's connector a view of a pool offloaded whole.

FlexKV's connectors register ``kv_buffer`` or ``k_buffer``/``v_buffer`` only: a pre-adapted whole view
(``adapt(pool)`` of an FP4/MXFP8/DSA/MiniMax pool) passed as ``kvcache`` would register the KV without
its scale or indexer planes, and every prefix hit would restore garbage.
"""

from __future__ import annotations

import pytest

from flexkv_adapter import AdapterError, adapt

from . import flexkv_standin as fk
from .connectors import OWN_MODULE, build
from .pools import DSA_ARGS, mp, mxfp8


def _mxfp8():
    return mxfp8(layers=3, heads=4)


@pytest.mark.parametrize("shape", ["old", "current"])
@pytest.mark.parametrize(
    "factory, model, page",
    [(lambda: mp().DSATokenToKVPool(**DSA_ARGS), "deepseek", 64), (_mxfp8, "llama", 16)],
    ids=["dsa", "mxfp8"],
)
def test_a_pre_adapted_whole_view_is_refused_not_registered_kv_only(sglang_env, models, shape, factory, model, page):
    sglang_env.use(shape)
    sglang_env.load()
    view = adapt(factory())
    assert view.whole is not None  # the premise: this pool has planes beside the KV
    # FlexKV's own connector refuses a DSA indexer before that (issue 15: it would overrun the buffer)
    with pytest.raises(AdapterError, match="offloaded whole|DSA/NSA indexer"):
        build(view, models[model], page_size=page, **({"module": OWN_MODULE} if shape == "current" else {}))
    assert not fk.calls("register_to_server")
