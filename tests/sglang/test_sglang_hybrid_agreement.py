"""SGLang 0.5.23's own hybrid and whole pools: plan(pool, **o) is plan(adapt(pool, **o)), and a round trip.

Before, plan() read a hybrid wrapper as a plain pool and refused it (``UnsupportedPoolError``) where adapt()
accepted it (``hybrid="attention_only"``, or MiniMax whole). Now both run one pipeline. For every class
and ``hybrid=`` choice the two give the same FlexKV registration, or the same error class; the one
asymmetry (DSA under ``hybrid="error"``) is the documented one. The attention-only plans then round-trip
through FlexKV's address arithmetic: store pages, scramble, restore into other pages, and compare through
the pool's own getters by global layer id, with the SWA KV and Mamba state left untouched.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from flexkv_adapter import adapt
from flexkv_adapter.flexkv import plan

from ..helpers import flexkv_worker_region
from ..hybrid_agreement import agreement, is_documented_asymmetry, tensors_key
from .pools import dsa, fp4, minimax, mla_fp4, mxfp8
from .pools import hybrid_linear as _hybrid_linear
from .pools import swa as _swa
from .test_sglang_hybrids import _qsa


def _minimax() -> Any:
    return minimax(size=64)


POOLS = {
    "swa-mha": lambda: _swa(False),
    "swa-mla": lambda: _swa(True),
    "hybrid-linear-mha": lambda: _hybrid_linear(False),
    "hybrid-linear-mla": lambda: _hybrid_linear(True),
    "hybrid-linear-dsa": lambda: _hybrid_linear(True, dsa=True),
    "qsa": _qsa,
    "minimax": _minimax,
    "minimax-k-only": lambda: minimax(k_only=True),
    "mha-fp4": fp4,
    "mha-mxfp8": mxfp8,
    "mla-fp4": mla_fp4,
    "dsa": dsa,
}
MODES = [None, "error", "attention_only"]
SRC, DST = [1, 2], [2, 0]


@pytest.mark.parametrize("mode", MODES, ids=["default", "error", "attention_only"])
@pytest.mark.parametrize("name", POOLS)
def test_plan_and_adapt_agree_on_sglangs_own_pools(name, mode):
    options = {} if mode is None else {"hybrid": mode}
    adapted, planned = agreement(POOLS[name](), options)
    if adapted[0] == "ok" and planned[0] == "refused":
        assert name == "dsa" and is_documented_asymmetry(adapted, planned, options), planned[2]
    if name.startswith(("swa", "hybrid-linear", "qsa")):  # state FlexKV cannot address: only attention_only plans
        assert (planned[0] == "ok") == (mode == "attention_only"), planned[2]
    if name in ("minimax", "mha-fp4", "mha-mxfp8", "mla-fp4", "dsa") and mode is None:  # whole, as adapt
        assert planned[0] == "ok" and len(planned[1].groups) == 2, planned[2]


def _kv_getters(pool: Any, layer_id: int, mla: bool) -> list[torch.Tensor]:
    return [pool.get_key_buffer(layer_id)] + ([] if mla else [pool.get_value_buffer(layer_id)])


def _fill(tensors: list[torch.Tensor], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in tensors:
        raw = t.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def _roundtrip(pool: Any, p: Any, all_ids: list[int], side: list[torch.Tensor]) -> list[str]:
    """Store SRC through the plan's addresses, scramble everything, restore into DST: every difference."""
    mla, page = p.kv_dim == 1, p.tokens_per_block
    everything = [t for lid in all_ids for t in _kv_getters(pool, lid, mla)] + side
    _fill(everything, 1)
    before = {lid: [t.clone() for t in _kv_getters(pool, lid, mla)] for lid in p.layer_ids}
    fields, tensors = p.layout_fields(), list(p.tensors)
    keys = [(layer, kv) for layer in range(p.num_layer) for kv in range(p.kv_dim)]
    cpu = {(k, i): flexkv_worker_region(fields, tensors, *k, b).clone() for k in keys for i, b in enumerate(SRC)}
    wrong = []
    for ((layer, kv), i), stored in cpu.items():  # FlexKV's layer l holds the model layer p.layer_ids[l]
        source = before[p.layer_ids[layer]][kv][SRC[i] * page : (SRC[i] + 1) * page]
        if not torch.equal(stored, source.contiguous().view(torch.uint8).flatten()):
            wrong.append(f"stored layer {layer} kv {kv} page {SRC[i]} is not layer id {p.layer_ids[layer]}'s")
    _fill(everything, 2)
    scrambled = [t.clone() for t in everything]
    for (key, i), data in cpu.items():
        flexkv_worker_region(fields, tensors, *key, DST[i]).copy_(data)
    for t, old in zip(everything, scrambled):  # what the plan does not register: exactly as scrambled
        expected = old
        for lid in p.layer_ids:
            for new, orig in zip(_kv_getters(pool, lid, mla), before[lid]):
                if new.data_ptr() == t.data_ptr():
                    expected = old.clone()
                    for b, d in zip(SRC, DST):
                        expected[d * page : (d + 1) * page] = orig[b * page : (b + 1) * page]
        if not torch.equal(t.view(torch.uint8), expected.view(torch.uint8)):
            wrong.append(f"{tuple(t.shape)} at {t.data_ptr():#x}")
    return wrong


def _swa_case(use_mla: bool) -> tuple[Any, list[int], list[torch.Tensor]]:
    return _swa(use_mla), [0, 1, 2, 3, 4], []


def _linear_case(use_mla: bool) -> tuple[Any, list[int], list[torch.Tensor]]:
    pool = _hybrid_linear(use_mla)
    cache = pool.mamba_pool.mamba_cache
    return pool, [1, 3], [*cache.conv, cache.temporal]


CASES = {
    "swa-mha": lambda: _swa_case(False),
    "swa-mla": lambda: _swa_case(True),
    "hybrid-linear-mha": lambda: _linear_case(False),
    "hybrid-linear-mla": lambda: _linear_case(True),
}


@pytest.mark.parametrize("name", CASES)
def test_an_attention_only_plan_of_the_pool_round_trips_by_global_layer_id(name):
    pool, all_ids, side = CASES[name]()
    p = plan(pool, hybrid="attention_only")
    assert tensors_key(p.tensors) == tensors_key(plan(adapt(pool, hybrid="attention_only")).tensors)
    assert _roundtrip(pool, p, all_ids, side) == []


@pytest.mark.parametrize("name", CASES)
def test_negative_control_a_plan_with_two_layers_swapped_is_caught(name):
    pool, all_ids, side = CASES[name]()
    p = plan(pool, hybrid="attention_only")
    ts = list(p.tensors)
    ts[0], ts[1] = ts[1], ts[0]  # layer 0's K registered as layer 1's: the registration broken on purpose
    wrong = _roundtrip(pool, replace(p, tensors=tuple(ts)), all_ids, side)
    assert any(f"is not layer id {p.layer_ids[0]}'s" in w for w in wrong), wrong


@pytest.mark.parametrize("conv", [np.int64, torch.tensor], ids=["numpy", "torch-0d"])
def test_sglangs_wrappers_with_numpy_or_tensor_ids_plan_as_with_ints(conv):
    for make, attr in ((lambda: _swa(False), "layers_mapping"), (lambda: _hybrid_linear(True), None)):
        pool, reference = make(), plan(make(), hybrid="attention_only")
        if attr:
            pool.layers_mapping = {conv(g): (conv(i), s) for g, (i, s) in pool.layers_mapping.items()}
        else:
            mapping = pool.full_attention_layer_id_mapping
            pool.full_attention_layer_id_mapping = {conv(g): conv(i) for g, i in mapping.items()}
        p = plan(pool, hybrid="attention_only")
        assert p.layer_ids == reference.layer_ids and all(type(i) is int for i in p.layer_ids)


@pytest.mark.parametrize("use_mla", [False, True], ids=["mha", "mla"])
def test_negative_control_a_plan_that_registers_swa_memory_is_caught(use_mla):
    pool, all_ids, side = _swa_case(use_mla)
    p = plan(pool, hybrid="attention_only")
    swa = pool.swa_kv_pool.kv_buffer if use_mla else pool.swa_kv_pool.k_buffer
    wrong = _roundtrip(pool, replace(p, tensors=(swa[0], *p.tensors[1:])), all_ids, side)
    assert any(str(tuple(swa[0].shape)) in w for w in wrong), wrong  # the SWA layer's bytes were overwritten
