"""Metadata beside the planes is read by the integer and flag rules, and every tensor an owner holds is accounted
for, wherever Python keeps it (``__slots__``, an ``nn.Module`` buffer, a dict attribute)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from flexkv_adapter import InconsistentLayersError, adapt
from flexkv_adapter.model.hybrid import HybridPoolError

from ..gate.test_gate import both_refuse, fp4_like

PAGE = 64


def dsa_like(**meta: Any) -> SimpleNamespace:
    """MLA KV and one index row per page (64 tokens of 132 bytes), with the indexer metadata given."""
    pool = SimpleNamespace(
        kv_buffer=[torch.zeros(4 * PAGE, 1, 32, dtype=torch.bfloat16) for _ in range(2)],
        index_k_with_scale_buffer=[torch.zeros(4, PAGE * 132, dtype=torch.uint8) for _ in range(2)],
        page_size=PAGE,
    )
    for name, value in meta.items():
        setattr(pool, name, value)
    return pool


@pytest.mark.parametrize("kpool, match", [(128, "does not divide the page size 64"), (-1, "positive"), (0, "positive")])
def test_index_kpool_is_read_with_its_bound(kpool, match):
    both_refuse(dsa_like(index_kpool=kpool), InconsistentLayersError, f"index_kpool.*{match}")
    assert adapt(dsa_like(index_kpool=1)).whole.planes[0].head_size == 132  # the control


@pytest.mark.parametrize("flag", ["kpool_use_compress", "index_kpool_compress"])
@pytest.mark.parametrize("value", [np.array([True, False]), torch.tensor([1, 0]), 1])
def test_compress_flags_are_read_by_the_flag_rule(flag, value):
    both_refuse(dsa_like(index_kpool=1, **{flag: value}), InconsistentLayersError, f"{flag} must be a bool")
    assert adapt(dsa_like(index_kpool=1, **{flag: np.bool_(False)})).whole is not None  # numpy bools are bools


class _SlotsPool:
    __slots__ = ("extra", "k_buffer", "k_scale_buffer", "page_size", "v_buffer", "v_scale_buffer")


class _ModulePool(torch.nn.Module):
    pass


def _with_state(where: str) -> object:
    source = fp4_like()
    pool: Any = _SlotsPool() if where == "slots" else _ModulePool() if where == "module" else SimpleNamespace()
    for name in ("k_buffer", "v_buffer", "k_scale_buffer", "v_scale_buffer", "page_size"):
        setattr(pool, name, getattr(source, name))
    state = torch.ones(64, 4)
    if where == "slots":
        pool.extra = state
    elif where == "module":
        pool.register_buffer("extra", state)
    else:
        pool.extra = {"hot": state}
    return pool


@pytest.mark.parametrize("where", ["slots", "module", "dict"])
def test_state_beside_the_planes_is_found_wherever_the_owner_keeps_it(where):
    both_refuse(_with_state(where), HybridPoolError, "extra")


def test_an_owner_with_slots_and_nothing_else_is_offloaded_whole():
    pool = _with_state("slots")
    pool.extra = None  # type: ignore[attr-defined]
    assert adapt(pool).whole is not None
