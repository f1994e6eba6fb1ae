"""Properties of the gate over pools with hostile planes (tests/strategies/planes.py): adapt() and plan() agree,
a whole view adapt() returns is one plan() registers, nothing raises a raw exception, and what is registered
holds every plane tensor once, as many as layers x (K, V), sharing no byte with another registered tensor."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, given, settings

from flexkv_adapter.flexkv import plan

from ..hybrid_agreement import agreement, is_documented_asymmetry
from ..strategies.planes import plane_pools

SOME = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _bytes(t: torch.Tensor) -> set[int]:
    """Every byte address a tensor covers (small tensors only)."""
    item, start = t.element_size(), t.data_ptr()
    offsets = torch.zeros(1, dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = (offsets[:, None] + torch.arange(size)[None, :] * stride).reshape(-1)
    return {start + int(o) * item + b for o in offsets for b in range(item)}


def _registered_disjoint(p: Any) -> None:
    seen: dict[int, str] = {}
    for g in p.groups:
        kv_dim = 2 if g.kv_dim == 2 else 1
        assert len(g.tensors) == len(g.layer_indices) * kv_dim, g.name
        distinct = {(t.data_ptr(), t.shape, t.stride()): t for t in g.tensors}
        for i, t in enumerate(distinct.values()):
            for byte in _bytes(t):
                assert seen.setdefault(byte, g.name) == g.name, f"{g.name}[{i}] shares a byte with {seen[byte]}"


@SOME
@given(plane_pools())
def test_adapt_and_plan_agree_on_pools_with_hostile_planes(case):
    pool, options, notes = case.pool, case.options, case.notes
    adapted, planned = agreement(pool, options)  # no raw exception: outcome() catches AdapterError only
    context = f"{notes} {options}: adapt {adapted[0]} {adapted[2][:300]} / plan {planned[0]} {planned[2][:300]}"
    if adapted[0] == "ok" and planned[0] == "refused":
        assert is_documented_asymmetry(adapted, planned, options), context
    if adapted[0] == "ok" and adapted[1].whole is not None:
        assert planned[0] == "ok", context  # a whole view adapt() hands out is one plan() registers
        _registered_disjoint(plan(adapted[1]))
    allowed = ("fine", "twice", "0-row") if notes["family"] == "indexer" else ("fine", "twice")  # 0 rows: skip-top-k
    if planned[0] == "ok" and notes.get("spoiled", "fine") not in allowed:
        raise AssertionError(f"a spoiled plane was registered: {context}")
