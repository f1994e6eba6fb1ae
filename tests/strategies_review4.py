"""Hypothesis strategies for the fourth review's classes (review-17), as :class:`~tests.strategies.Case` s.

Layer views over shared bytes on the general path (row for row: fine; rows shifted: refused), and dicts
whose keys are hostile (raising or huge ``__str__``/``__repr__``, non-str keys) with ``layer_ids=`` right,
wrong or absent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from .helpers import distinct
from .strategies import DTYPE, Case, aligned_regions


@st.composite
def shifted_overlaps(draw: st.DrawFn) -> Case:
    """K layers (or K beside V) in one buffer, each starting ``shift`` rows after the previous one."""
    layers, heads, dim = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 4]))
    page = draw(st.sampled_from([1, 2, 4]))
    rows = page * draw(st.integers(1, 3))
    shift = draw(st.integers(0, rows + 1))
    row = heads * dim
    base = distinct(((rows + shift * (2 * layers)) * row,), DTYPE)
    views = [base[i * shift * row :][: rows * row].view(rows, heads, dim) for i in range(2 * layers)]
    form = draw(st.sampled_from(["k-list", "k-and-v", "dict"]))
    if form == "k-and-v":  # layer i's V starts shift rows into its K
        ks, vs = views[0::2], views[1::2]
    else:
        ks, vs = views[:layers], [distinct((rows, heads, dim), DTYPE, 5000 + 100 * i) for i in range(layers)]
    k: Any = {f"layers.{i}": t for i, t in enumerate(ks)} if form == "dict" else ks
    v: Any = {f"layers.{i}": t for i, t in enumerate(vs)} if form == "dict" else vs
    pool = SimpleNamespace(k_buffer=k, v_buffer=v, page_size=page)
    overlapping = 0 < shift < rows and (form == "k-and-v" or layers > 1)
    expected = None if overlapping else {"k": ks, "v": vs}
    ok = expected is not None and row * page * 4 % 8 == 0 and aligned_regions(expected, page)
    roots = [base] if form == "k-and-v" else [base, *vs]
    return Case(pool, {}, expected, roots, ok, list(range(layers)), {"form": form, "shift": shift})


class _Key:
    """A dict key whose text is hostile."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __str__(self) -> str:
        if self.how == "raise":
            raise RuntimeError("no text")
        return "layers.7" + ".x" * 50_000

    __repr__ = __str__


@st.composite
def hostile_keys(draw: st.DrawFn) -> Case:
    """Per-layer K/V dicts with one hostile key; only layer_ids= (in the dict's order) may label it."""
    layers = draw(st.integers(2, 3))
    rows, page = 8, 4
    ks = [distinct((rows, 2, 2), DTYPE, 100 * i) for i in range(layers)]
    vs = [distinct((rows, 2, 2), DTYPE, 100 * i + 50) for i in range(layers)]
    key: object = draw(st.sampled_from([_Key("raise"), _Key("huge"), b"layers.1", ("layers", 1), 1.0]))
    slot = draw(st.integers(0, layers - 1))
    keys: list[object] = [f"model.layers.{i}.attn" for i in range(layers)]
    keys[slot] = key
    pool = SimpleNamespace(k_buffer=dict(zip(keys, ks)), v_buffer=dict(zip(keys, vs)), page_size=page)
    mode = draw(st.sampled_from(["right", "none", "wrong"]))
    ids = [i if i != slot else 40 + i for i in range(layers)]
    options: dict[str, Any] = {}
    if mode == "right":
        options["layer_ids"] = ids
    elif mode == "wrong":
        options["layer_ids"] = [i + 1 for i in ids]  # contradicts the named entries
    good = mode == "right"
    expected = {"k": ks, "v": vs} if good else None
    return Case(pool, options, expected, [*ks, *vs], good, ids if good else None, {"key": type(key).__name__})
