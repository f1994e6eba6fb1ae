"""vLLM 0.33 dicts go through the common view builder (build.build_view), like every other source.

The view of a vLLM dict equals, pointer for pointer and byte for byte, the generic reading of the same
tensors (``axes="P H T D"``), and the FlexKV form plan() registers; where one refuses, so does the other.
Each rule of the builder is shown to run for a vLLM dict by replacing it with one that raises.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flexkv_adapter.pipeline.build as build
from flexkv_adapter import (
    AmbiguousLayoutError,
    InconsistentLayersError,
    NotAddressableError,
    UnsupportedPoolError,
    adapt,
)
from flexkv_adapter.pipeline.adapting import recognise
from flexkv_adapter.pipeline.metadata import resolve_geometry
from flexkv_adapter.readers.vllm_layout import LAYOUTS, vllm_form, vllm_twin

from ..helpers import SGLangLikeMHAPool
from ..strategies.vllm import CopyingMapping, layer_views, vllm_033_dicts
from ..view_facts import accepted_or_refused as _outcome
from ..view_facts import view_facts as _facts


@settings(max_examples=80, deadline=None)
@given(case=vllm_033_dicts())
def test_a_vllm_dict_view_is_the_generic_view_of_the_same_tensors(case):
    kv, page, ratio = case["kv"], case["tokens"], case["ratio"]
    how, via_vllm = _outcome(lambda: adapt(kv, kind="mla", page_size=page))
    generic_how, generic = _outcome(lambda: adapt(kv, axes="P H T D", kind="mla", page_size=page))
    if case["variant"] == "groups":  # HMA: vLLM's block ids differ per group, which only the vLLM reading knows
        assert how == "refused" and isinstance(via_vllm, InconsistentLayersError), via_vllm
        assert generic_how == "refused" or any("overlaps" in w for w in generic.report.warnings)
        return
    assert how == generic_how, (case, via_vllm, generic)
    if how == "refused":
        return
    assert _facts(via_vllm) == _facts(generic)
    assert (via_vllm.page_size, via_vllm.num_blocks) == (generic.page_size, generic.num_blocks)
    manager = adapt(kv, kind="mla", page_size=page * ratio)  # kernel blocks regrouped: the same tensors
    assert _facts(manager) == _facts(via_vllm) and manager.num_blocks * ratio == via_vllm.num_blocks
    form = vllm_form(kv, kind="mla", block_size=page * ratio)  # what plan() registers, pointer for pointer
    for t, chunk in zip(manager.kv_buffer, form.chunks):
        assert (t.data_ptr(), tuple(t.shape)) == (
            chunk.data_ptr(),
            (chunk.shape[0] * chunk.shape[1], 1, chunk.shape[3]),
        )


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4])),
    content=st.sampled_from([4, 8]),
)
def test_a_generic_reading_fits_a_vllm_dict_only_where_the_ambiguity_rule_refuses_it(layout, shape, content):
    """The vLLM reading is chosen without asking the generic recogniser; that is safe only because every
    vLLM dict that another reading fits is refused as ambiguous (vllm_twin), so no fit is passed over."""
    layers, blocks, heads, tokens = shape
    kv = {
        f"model.layers.{i}.attn": v for i, v in enumerate(layer_views(layout, layers, blocks, heads, tokens, content))
    }
    try:
        recognise(kv, resolve_geometry(kv, None, {}), {})
        fits = True
    except UnsupportedPoolError:
        fits = False
    except AmbiguousLayoutError:
        fits = True
    if fits:
        assert vllm_twin(list(kv.values())) is not None
        with pytest.raises(AmbiguousLayoutError):
            adapt(kv, kind="mla" if heads == 1 else "mha", page_size=tokens)


def _mla_dict() -> dict[str, torch.Tensor]:
    return {f"model.layers.{i}.attn": v for i, v in enumerate(layer_views("LBNHC", 2, 4, 1, 4, 8))}


@pytest.mark.parametrize("rule", build.RULES)
def test_every_rule_of_the_common_builder_runs_for_a_vllm_dict(rule, monkeypatch):
    class Ran(Exception):
        pass

    def ran(*args: object, **kwargs: object) -> None:
        raise Ran(rule)

    monkeypatch.setattr(build, rule, ran)
    with pytest.raises(Ran):
        adapt(_mla_dict(), kind="mla", page_size=8)
    with pytest.raises(Ran):  # and for a pool, as for every source
        adapt(SGLangLikeMHAPool(32, 4, torch.float32, head_num=2, head_dim=4, layer_num=2))


def test_the_rule_list_names_every_check_the_builder_calls():
    """A check added to build_view (from carve, the builder, the metadata or the gate) joins RULES, so the test
    above covers it."""
    modules = (
        "flexkv_adapter.pipeline.carve",
        "flexkv_adapter.pipeline.build",
        "flexkv_adapter.pipeline.metadata",
        "flexkv_adapter.gate",
    )
    called = {
        name
        for name in build.build_view.__code__.co_names
        if callable(found := getattr(build, name, None)) and getattr(found, "__module__", "") in modules
    }
    transforms = {"trim_rows", "reinterpret"}  # reshape the views, check nothing
    assert called - transforms == set(build.RULES)


def test_a_mapping_whose_entries_are_copies_is_refused_not_adapted():
    """items() shows one buffer's views, [] hands out copies: the old vLLM builder aliased the copies."""
    with pytest.raises(NotAddressableError, match="new memory on every read"):
        adapt(CopyingMapping(_mla_dict()), kind="mla", page_size=8)
