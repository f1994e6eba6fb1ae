"""vLLM's real KV cache dicts (0.32 or 0.33): adapt()'s vLLM reading gives, pointer for pointer and byte for byte,
the view the generic reading (``axes="P H T D"``) gives of the same tensors, and plan()'s chunks; where
one refuses, so does the other. Both go through one builder (flexkv_adapter.pipeline.build.build_view).
"""

from __future__ import annotations

import pytest

from flexkv_adapter import adapt
from flexkv_adapter.readers.vllm_layout import vllm_form

from ..view_facts import accepted_or_refused as _outcome
from ..view_facts import view_facts as _facts
from .build import CASES, LAYOUTS, allocate


@pytest.mark.parametrize("sharing", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_vllm_view_is_the_generic_view_of_vllms_own_tensors(layout, case, sharing):
    kv_caches, _, _ = allocate(layout, case)
    if sharing:  # gpu_model_runner: kv_caches[layer_name] = kv_caches[target_layer_name]
        kv_caches["model.layers.3.self_attn.attn"] = kv_caches["model.layers.1.self_attn.attn"]
    manager = CASES[case][1]["block_size"]
    kernel = next(iter(kv_caches.values())).shape[2]
    how, via_vllm = _outcome(lambda: adapt(kv_caches, kind="mla", page_size=kernel))
    generic_how, generic = _outcome(lambda: adapt(kv_caches, axes="P H T D", kind="mla", page_size=kernel))
    assert how == generic_how, (via_vllm, generic)
    if how == "refused":
        return
    assert _facts(via_vllm) == _facts(generic)
    view = adapt(kv_caches, kind="mla", page_size=manager)
    assert _facts(view) == _facts(via_vllm) and view.page_size == manager
    form = vllm_form(kv_caches, kind="mla", block_size=manager)
    for t, c in zip(view.kv_buffer, form.chunks):
        assert (t.data_ptr(), tuple(t.shape)) == (c.data_ptr(), (c.shape[0] * c.shape[1], 1, c.shape[3]))
