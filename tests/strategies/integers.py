"""Hostile integers for every way in (:mod:`tests.config.test_integer_ways`): one value, every numeric costume.

A drawn value is an integer a pool of 64 rows accepts as its page size (a divisor of 64), a layer id,
or one the integer rule must refuse in every path: zero, negative, at or past ``integers.LIMIT``, and
the same numbers dressed as bools, floats (``16.0`` too), strings, Fractions, Decimals, numpy scalars,
0-d tensors, IntEnums and ``__index__`` objects.
"""

from __future__ import annotations

from decimal import Decimal
from enum import IntEnum
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from flexkv_adapter.config.integers import LIMIT

ROWS = 64  # rows per layer of the test pool: an accepted page size divides it
_SIZES = [1, 2, 4, 8, 16, 32, 64]
_OUT_OF_RANGE = [0, -1, -16, LIMIT, LIMIT + 16, 2**63, 10**30, -(10**30)]


class _Index:
    """A number only through ``__index__`` (which may return ``True``: still a bool, not 1)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"_Index({self.n!r})"


def _number(draw: st.DrawFn, value: int) -> tuple[object, bool]:
    """``value`` in a drawn numeric type, and whether the one integer reader must accept it."""
    kind = draw(
        st.sampled_from(
            [
                *("int", "np.int64", "np.int32", "np.uint8", "tensor", "np0d", "bool", "float"),
                *("IntEnum", "__index__", "Fraction", "Decimal"),
            ]
        )
    )
    if kind == "bool":
        return draw(st.sampled_from([True, np.True_, torch.tensor(True), np.array(True), _Index(True)])), False
    if kind in ("Fraction", "Decimal"):
        return (Fraction(value) if kind == "Fraction" else Decimal(value)), False
    if kind == "float":
        return draw(st.sampled_from([float(value), np.float32(value), torch.tensor(float(value))])), False
    make = {
        "int": int,
        "np.int64": np.int64,
        "np.int32": np.int32,
        "np.uint8": np.uint8,
        "tensor": lambda n: torch.tensor(n),
        "np0d": lambda n: np.array(n),
        "IntEnum": lambda n: IntEnum("Number", {"N": n}).N,  # type: ignore[attr-defined]
        "__index__": _Index,
    }[kind]
    return make(value), True


@st.composite
def hostile_integers(draw: st.DrawFn, minimum: int = 1) -> Any:
    """A value in a drawn costume (the reader's verdict is the test's business, not the strategy's)."""
    sizes = _SIZES if minimum == 1 else [0, 1, 3, 64, 10**6, LIMIT - 1]
    number = draw(st.sampled_from(sizes + _OUT_OF_RANGE) | st.integers(-(2**70), 2**70).filter(lambda n: n < 1))
    costume = draw(st.sampled_from(["number", "str", "odd"]))
    if costume == "str":
        return draw(st.sampled_from([str(number), f"{number}.0", f" {number} "]))
    if costume == "odd":
        small = [np.int64(number), torch.tensor(number), _Index(number)] if abs(number) < 2**62 else [_Index(number)]
        return draw(
            st.sampled_from(
                [float(number) + 0.5, Fraction(number), Decimal(number), np.float64(number), _Index(True), *small]
            )
        )
    if 0 <= number < 128:  # every numeric costume of _number (numpy int8..uint8 hold it)
        return _number(draw, number)[0]
    return number


def env_texts() -> st.SearchStrategy[str]:
    """What an environment variable may hold where an integer belongs."""
    numbers = st.sampled_from(_SIZES + _OUT_OF_RANGE) | st.integers(-(10**25), 10**25)
    return st.one_of(
        numbers.map(str),
        numbers.map(lambda n: f" +{n} "),
        numbers.map(lambda n: f"{n}.0"),
        st.sampled_from(["", "true", "1_6", "0x10", "1e1", "\u0663", "\uff11\uff16", "16 16", "-", "nan", "9" * 5000]),
        st.text(alphabet="0123456789 +-._xe", max_size=12),
    )


def durations() -> st.SearchStrategy[object]:
    """Timeouts: in and out of ``(0, 7 days]``, non-finite, and in costumes a duration must not wear."""
    seconds = st.sampled_from([0.5, 60, 604800, 604800.5, 1e9, 0, -1, 10**400]) | st.floats(allow_nan=True)
    return st.one_of(
        seconds,
        seconds.filter(lambda x: abs(x) < 1e300).map(lambda x: np.float64(x)),
        st.sampled_from([True, np.True_, "60", "1e3", torch.tensor(5.0), Decimal("60"), Fraction(1, 2)]),
    )
