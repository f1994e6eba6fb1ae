"""plan() of raw tensors reads the bytes plan(adapt()) reads: the same element type, the same planes.

The as-is path (raw paged tensors FlexKV registers as they are) used to ignore ``dtype=`` and to look for
planes on the top-level pool only; both now go through adapt()'s reading.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.flexkv import plan
from flexkv_adapter.model.hybrid import HybridPoolError

plan_module = importlib.import_module("flexkv_adapter.flexkv.plan")  # the package exports plan() under its name
DTYPES = [None, torch.uint8, torch.bfloat16, torch.float16, torch.float32]


def raw_layers(layers: int, blocks: int, tokens: int, heads: int, width: int) -> list[torch.Tensor]:
    """Per-layer vLLM-style ``[2, NB, BS, H, D]`` byte tensors, every byte distinct per position."""
    n = 2 * blocks * tokens * heads * width
    return [
        ((torch.arange(n) + 7 * i) % 251).to(torch.uint8).view(2, blocks, tokens, heads, width) for i in range(layers)
    ]


def facts(p: Any) -> tuple[Any, ...]:
    """What FlexKV reads a block as: element type and geometry (the as-is plan registers per-layer [K|V]
    tensors, adapt()'s view K and V apart: the same bytes, other tensor counts)."""
    return (p.dtype, p.num_layer, p.num_block, p.tokens_per_block, p.num_head, p.head_size)


def agree(source: object, **options: Any) -> bool:
    """plan(x, **o) and plan(adapt(x, **o)): the same dtype and geometry, or both refused."""
    try:
        direct = facts(plan(source, **options))
    except AdapterError:
        direct = None
    try:
        via = facts(plan(adapt(source, **options)))
    except AdapterError:
        via = None
    return direct == via


@given(
    layers=st.integers(1, 3),
    blocks=st.sampled_from([3, 4]),  # 2 blocks: the as-is 5-D registration is refused (FlexKV's K/V probe)
    tokens=st.sampled_from([8, 16]),
    heads=st.sampled_from([1, 2]),
    width=st.sampled_from([8, 16, 32]),
    dtype=st.sampled_from(DTYPES),
)
def test_plan_of_raw_tensors_reads_as_plan_of_adapt(layers, blocks, tokens, heads, width, dtype):
    options = {"axes": "KV P T H D"} | ({"dtype": dtype} if dtype is not None else {})
    assert agree(raw_layers(layers, blocks, tokens, heads, width), **options)


def test_negative_control_a_plan_that_ignores_dtype_breaks_the_property(monkeypatch):
    original = plan_module._as_is

    def ignoring_dtype(record: Any) -> Any:  # the as-is path as it was: the record's dtype never read
        return original(dataclasses.replace(record, options={k: v for k, v in record.options.items() if k != "dtype"}))

    monkeypatch.setattr(plan_module, "_as_is", ignoring_dtype)
    assert not agree(raw_layers(3, 4, 16, 2, 16), axes="KV P T H D", dtype=torch.bfloat16)


def test_dtype_reads_the_bytes_as_that_type():
    p = plan(raw_layers(3, 4, 16, 2, 16), axes="KV P T H D", dtype=torch.bfloat16)
    assert (p.dtype, p.head_size) == (torch.bfloat16, 8)  # 16 bytes a head: 8 bf16 elements


def test_planes_of_a_sub_pool_named_by_attrs_are_not_dropped():
    """Paged MLA rows ``[P, T, D]`` inside ``inner``, its scales beside them: registering the KV alone would
    leave the scales behind; plan() refuses as adapt() does, naming them."""
    inner = SimpleNamespace(
        kv_buffer=[torch.zeros(4, 16, 24, dtype=torch.bfloat16) for _ in range(2)],
        kv_scale_buffer=[torch.zeros(4, 16, 4, dtype=torch.float32) for _ in range(2)],
    )
    pool = SimpleNamespace(inner=inner)
    for route in (plan, adapt):
        with pytest.raises(HybridPoolError, match="inner.kv_scale_buffer"):
            route(pool, attrs=["inner.kv_buffer"], axes="P T D")
