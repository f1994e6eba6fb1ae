"""plan_vllm (plan() of a vLLM 0.33 dict, and the vLLM plugin's registration) passes the memory gate.

Split from ``test_vllm_layout`` (the 350-line ceiling). :func:`~flexkv_adapter.flexkv.vllm_plan.plan_form`
calls :func:`~flexkv_adapter.gate.admit` on every plan it returns: layers that share bytes without being one
tensor are refused by the overlap rule, one tensor under two layer names (vLLM's KV sharing) is accepted
with the gate's warning, and a form holding no memory is refused by the tensor rule.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings

from flexkv_adapter import AdapterError, InconsistentLayersError, UnsupportedPoolError
from flexkv_adapter.flexkv import plan
from flexkv_adapter.flexkv.vllm_plan import plan_form, plan_vllm
from flexkv_adapter.readers.vllm_layout import vllm_form

from ..strategies.vllm import aliased_storage_dicts, vllm_033_dicts
from .test_vllm_layout import views

GATE_OVERLAP = "share bytes"  # admit()'s overlap rule
HMA = "distinct views of the same bytes"  # read_geometry's: same start, another view
LOGGER = "flexkv_adapter.flexkv.checks"  # admit_plan: every plan's gate line


def _plan_vllm(kv):
    v = next(iter(kv.values()))
    return plan_vllm(kv, kind="mha" if v.shape[1] > 1 else "mla", block_size=v.shape[2])


def _elements(t: torch.Tensor) -> set[int]:
    return set(t.flatten().tolist())  # aliased_storage_dicts: each element holds its index in the allocation


@settings(max_examples=300, deadline=None)
@given(aliased_storage_dicts())
def test_layers_sharing_bytes_without_being_one_tensor_are_refused_and_accepted_plans_are_disjoint(kv):
    entries = list(kv.values())
    shared = any(_elements(a) & _elements(b) for a, b in combinations(entries, 2))
    try:
        p = _plan_vllm(kv)
    except AdapterError as exc:
        reason = GATE_OVERLAP if GATE_OVERLAP in str(exc) else HMA if HMA in str(exc) else type(exc).__name__
        event(f"shared={shared}: {reason}")
        if reason in (GATE_OVERLAP, HMA):
            assert isinstance(exc, InconsistentLayersError) and shared
        return
    event(f"accepted {p.type.value}")
    assert not shared, f"plan_vllm registered layers that share bytes: {p}"
    registered = [_elements(t) for t in p.tensors]
    assert sum(map(len, registered)) == sum(t.numel() for t in p.tensors) == len(set().union(*registered))
    assert set().union(*registered) == set().union(*map(_elements, entries))  # exactly the entries' memory


def _overlapping_pair() -> dict[str, torch.Tensor]:
    """Two MLA layers of an LBNHC allocation in two storages: layer 1 starts half a layer into layer 0."""
    blocks, tokens, content = 4, 2, 8
    layer = blocks * tokens * content
    raw = np.arange(3 * layer, dtype=np.int64)
    a = torch.from_numpy(raw[layer : 3 * layer]).view(2, blocks, tokens, 1, content)
    b = torch.from_numpy(raw[layer // 2 : layer // 2 + 2 * layer]).view(2, blocks, tokens, 1, content)
    return {"model.layers.0.attn": a[0].permute(0, 2, 1, 3), "model.layers.1.attn": b[1].permute(0, 2, 1, 3)}


def test_an_overlapping_pair_is_refused_by_the_gate_overlap_rule():
    kv = _overlapping_pair()
    with pytest.raises(InconsistentLayersError, match=GATE_OVERLAP):
        plan_vllm(kv, kind="mla")
    # plan() never reaches plan_vllm here: two storage starts are not one vLLM allocation (is_vllm_dict),
    # so the general path refuses the dict (no reading of 4-D per-layer views) before any gate
    with pytest.raises(AdapterError):
        plan(kv, kind="mla")


def test_plan_form_admits_what_it_registers_whatever_the_form():
    """The tensor and overlap rules, on a form whose tensors are not the views' memory."""
    form = vllm_form(views("LBNHC", 2, 3, 1, 4, 8), kind="mla")
    meta = torch.empty_like(form.tensors[1], device="meta")
    with pytest.raises(UnsupportedPoolError, match="meta device.*real memory"):
        plan_form(replace(form, tensors=(form.tensors[0], meta)))
    first = form.tensors[0]  # layer 1 as layer 0 shifted by one block: its last blocks are layer 0's
    inside = first.as_strided(first.shape, first.stride(), first.storage_offset() + first.stride(0))
    with pytest.raises(InconsistentLayersError, match=GATE_OVERLAP):
        plan_form(replace(form, tensors=(form.tensors[0], inside)))


@pytest.mark.parametrize("route", ["plan", "plan_vllm"])
def test_a_dict_of_meta_tensors_is_refused_as_no_memory(route):
    """A guard, not the gate's test: the reader refuses these before any plan (storage_problem, as the gate's
    tensor rule); test_plan_form_admits_what_it_registers_whatever_the_form reaches the gate itself."""
    kv = {f"model.layers.{i}.attn": torch.empty(3, 1, 4, 8, device="meta") for i in range(2)}
    call = (lambda: plan(kv, kind="mla")) if route == "plan" else (lambda: plan_vllm(kv, kind="mla"))
    with pytest.raises(UnsupportedPoolError, match="meta device"):
        call()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(vllm_033_dicts(variants=("kv-sharing",)))
def test_one_tensor_under_two_layer_names_is_accepted_with_the_gate_warning(caplog, case):
    kv = case["kv"]
    kind, block = "mha" if case["heads"] > 1 else "mla", case["tokens"] * case["ratio"]
    for call in (lambda: plan(kv, kind=kind, page_size=block), lambda: plan_vllm(kv, kind=kind, block_size=block)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            try:
                p = call()
            except AdapterError as exc:
                assert GATE_OVERLAP not in str(exc) and HMA not in str(exc)
                event(f"refused: {type(exc).__name__}")  # not token-major, or BLOCKFIRST (no slot per name)
                continue
        event(f"accepted {p.type.value}")
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert p.num_layer == len(kv) and len(lines) == 1 and "overlaps" in lines[0], lines


@pytest.mark.parametrize("route", ["plan", "plan_vllm"])
def test_a_dict_with_no_shared_tensor_plans_without_a_gate_line(caplog, route):
    kv = views("LBNHC", 3, 3, 1, 4, 8)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        p = plan(kv, kind="mla") if route == "plan" else plan_vllm(kv, kind="mla")
    assert p.num_layer == 3 and not [r for r in caplog.records if r.name == LOGGER]
