"""Options and pool metadata are checked against every owner attrs= names, within their bounds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import InconsistentLayersError, adapt

from ..gate.test_gate import both_refuse


def _owner(dtype: torch.dtype, **meta: object) -> SimpleNamespace:
    return SimpleNamespace(
        buf=[torch.zeros(32, 2, 8, dtype=torch.bfloat16) for _ in range(2)], dtype=dtype, page_size=16, **meta
    )


def test_an_option_is_checked_against_every_attrs_owner():
    pool = SimpleNamespace(a=_owner(torch.bfloat16), b=_owner(torch.bfloat16))
    attrs = ["a.buf", "b.buf"]
    both_refuse(
        pool,
        InconsistentLayersError,
        "option dtype=torch.float16 contradicts pool.a.dtype",
        attrs=attrs,
        dtype=torch.float16,
    )
    assert adapt(pool, attrs=attrs).dtype == torch.bfloat16  # the control: no option, owners agree


@pytest.mark.parametrize(
    "name, values",
    [
        ("dtype", (torch.bfloat16, torch.float16)),
        ("store_dtype", (torch.uint8, torch.int8)),
        ("kv_cache_layout", ("nhd", "hnd")),
    ],
)
def test_attrs_owners_that_disagree_are_refused(name, values):
    a, b = _owner(torch.bfloat16), _owner(torch.bfloat16)
    setattr(a, name, values[0])
    setattr(b, name, values[1])
    both_refuse(
        SimpleNamespace(a=a, b=b),
        InconsistentLayersError,
        f"pool.a.{name}=.* but pool.b.{name}=",
        attrs=["a.buf", "b.buf"],
    )


@pytest.mark.parametrize("start", [2**40, 10**30])
def test_start_layer_beyond_the_metadata_bound_is_refused(start):
    pool = SimpleNamespace(k_buffer=[torch.zeros(32, 2, 8)], v_buffer=[torch.zeros(32, 2, 8)], page_size=16)
    pool.start_layer = start
    both_refuse(pool, InconsistentLayersError, r"start_layer=\d+ is out of range.*below 2\*\*40")
    pool.start_layer = 2**40 - 1
    assert adapt(pool).layer_ids == [2**40 - 1]
