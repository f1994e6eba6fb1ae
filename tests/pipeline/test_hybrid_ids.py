"""A hybrid wrapper's layer ids go through the one integer rule (integers.py), on every way in.

``layers_mapping``, ``full_attention_layer_id_mapping``, ``index_*_layer_id_mapping``, ``model_layer_ids``
and ``mamba_layer_ids`` took Python ints only: a numpy or 0-d tensor id (what a config parsed with numpy,
or a mapping built from a tensor, holds) was refused as malformed. They now read as the same ints; bools
(True is not a layer id), floats, negatives and two keys naming one id stay refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from flexkv_adapter import InconsistentLayersError, adapt
from flexkv_adapter.cli.samples import _hybrid_linear_pool, _minimax_pool, _swa_pool
from flexkv_adapter.flexkv import plan

from ..strategies.hybrids import duplicated_ids

NUMERIC = {"numpy-int64": np.int64, "numpy-uint8": np.uint8, "torch-0d": lambda i: torch.tensor(i)}
HOSTILE = {"bool": lambda i: i == i, "float": float, "negative": lambda i: -i - 1, "numpy-float": np.float64}


def _swa(conv: Any, flag: Any = bool) -> Any:
    pool = _swa_pool()
    pool.layers_mapping = {conv(g): (conv(i), flag(s)) for g, (i, s) in pool.layers_mapping.items()}
    return pool


def _linear(conv: Any) -> Any:
    pool = _hybrid_linear_pool()
    pool.full_attention_layer_id_mapping = {conv(g): conv(i) for g, i in pool.full_attention_layer_id_mapping.items()}
    pool.mamba_pool.mamba_layer_ids = [conv(i) for i in pool.mamba_pool.mamba_layer_ids]
    return pool


def _minimax(conv: Any) -> Any:
    pool = _minimax_pool()
    del pool.index_k_pool, pool.index_k_layer_id_mapping  # K-only layers are refused whatever their ids
    pool.index_kv_pool.page_size = pool.page_size  # as SGLang's index pool carries it: offloaded whole
    pool.index_kv_layer_id_mapping = {conv(g): conv(i) for g, i in pool.index_kv_layer_id_mapping.items()}
    pool.main_pool.model_layer_ids = [conv(i) for i in pool.main_pool.model_layer_ids]
    return pool


def _ints(ids: Any) -> list[int]:
    assert all(type(i) is int for i in ids), [type(i) for i in ids]
    return list(ids)


@pytest.mark.parametrize("conv", NUMERIC.values(), ids=NUMERIC.keys())
def test_numeric_ids_read_as_the_same_ints_everywhere(conv):
    swa = adapt(_swa(conv), hybrid="attention_only")
    assert _ints(swa.layer_ids) == [1, 4] and _ints(plan(_swa(conv), hybrid="attention_only").layer_ids) == [1, 4]
    assert [_ints(g.layer_ids) for g in swa.side_groups] == [[0, 2, 3], [0, 2, 3]]
    linear = adapt(_linear(conv), hybrid="attention_only")
    assert _ints(linear.layer_ids) == [2, 5] and all(_ints(g.layer_ids) == [0, 1, 3] for g in linear.side_groups)
    minimax = adapt(_minimax(conv))
    assert _ints(minimax.layer_ids) == [0, 1, 2] and _ints(minimax.whole.planes[0].layer_ids) == [1]
    assert [g.layer_indices for g in plan(_minimax(conv)).groups] == [(0, 1, 2), (1,)]


@pytest.mark.parametrize("flag", [np.bool_, lambda b: torch.tensor(b)], ids=["numpy", "torch-0d"])
def test_an_is_swa_flag_of_numpy_or_torch_bool_reads_as_the_bool(flag):
    assert adapt(_swa(int, flag), hybrid="attention_only").layer_ids == [1, 4]


@pytest.mark.parametrize("conv", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize("build", [_swa, _linear, _minimax], ids=["swa", "linear", "minimax"])
def test_bools_floats_and_negatives_are_refused_by_adapt_and_plan_alike(build, conv):
    for call in (adapt, plan):
        with pytest.raises(InconsistentLayersError, match="integer|layer id"):
            call(build(conv), hybrid="attention_only")


def test_an_integer_is_swa_flag_is_refused():
    with pytest.raises(InconsistentLayersError, match="is_swa must be a bool"):
        adapt(_swa(int, int), hybrid="attention_only")


@settings(max_examples=20, deadline=None)
@given(duplicated_ids())
def test_two_keys_that_read_as_one_layer_id_are_refused(case):
    pool, where = case
    for call in (adapt, plan):
        with pytest.raises(InconsistentLayersError, match=f"{where}.*(once|distinct)"):
            call(pool, hybrid="attention_only")


@pytest.mark.parametrize("shift", [1 << 40, 1 << 62])
def test_a_layer_id_past_the_one_limit_is_refused_in_a_mapping_as_in_the_option(shift: int) -> None:
    """integers.LIMIT bounds every layer id: a consistent mapping may not hold ids the ``layer_ids``
    option refuses (they were accepted up to 2**63 here)."""
    pool = _swa_pool()
    pool.layers_mapping = {g + shift: v for g, v in pool.layers_mapping.items()}
    pool.full_kv_pool.model_layer_ids = [i + shift for i in pool.full_kv_pool.model_layer_ids]
    for way_in in (adapt, plan):
        with pytest.raises(InconsistentLayersError, match="integer below 1099511627776"):
            way_in(pool, hybrid="attention_only")


def test_ids_just_under_the_limit_still_read() -> None:
    shift = (1 << 40) - 8
    pool = _swa_pool()
    pool.layers_mapping = {g + shift: v for g, v in pool.layers_mapping.items()}
    pool.full_kv_pool.model_layer_ids = [i + shift for i in pool.full_kv_pool.model_layer_ids]
    assert list(plan(pool, hybrid="attention_only").layer_ids) == [shift + 1, shift + 4]
