"""Pools that hide their K/V in containers, metadata or getters, as :class:`~tests.strategies.cases.Case` s.

Containers nested in containers (named directly, by dotted attrs=, or left to recognise), metadata and
options in every numeric type, and getters that copy (refused) or return fresh views of the same memory
(fine).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from ..helpers import distinct
from .cases import DTYPE, Case, _ok, draw_geometry
from .integers import _number


def _kv(draw: st.DrawFn, layers: int) -> tuple[list[torch.Tensor], list[torch.Tensor], int, int]:
    heads, dim, page, rows = draw_geometry(draw)
    ks = [distinct((rows, heads, dim), DTYPE, 1000 * i) for i in range(layers)]
    vs = [distinct((rows, heads, dim), DTYPE, 1000 * i + 500) for i in range(layers)]
    return ks, vs, page, int(_ok(page, heads, dim) and rows >= page)


def _holder(draw: st.DrawFn, tensors: list[torch.Tensor], named: bool) -> Any:
    """Per-layer tensors as a list, a tuple, a dict of layer names, or one level deeper (refused)."""
    form = draw(st.sampled_from(["list", "tuple", "dict", "dict-in-list", "list-in-dict", "list-in-list"]))
    if form == "dict" and not named:
        form = "list"
    return form, {
        "list": lambda: list(tensors),
        "tuple": lambda: tuple(tensors),
        "dict": lambda: {f"model.layers.{i}.attn": t for i, t in enumerate(tensors)},
        "dict-in-list": lambda: [{f"model.layers.{i}.attn": t for i, t in enumerate(tensors)}],
        "list-in-dict": lambda: {"layers": list(tensors)},
        "list-in-list": lambda: [list(tensors)],
    }[form]()


@st.composite
def nested_containers(draw: st.DrawFn) -> Case:
    """K/V containers of any form inside objects, named directly, by dotted attrs=, or left to recognise."""
    layers = draw(st.integers(1, 3))
    ks, vs, page, ok = _kv(draw, layers)
    (kform, k), (vform, v) = _holder(draw, ks, True), _holder(draw, vs, True)
    depth = draw(st.integers(0, 2))
    inner: Any = SimpleNamespace(k_buffer=k, v_buffer=v)
    path = ""
    for level in range(depth):
        inner, path = SimpleNamespace(**{f"lvl{level}": inner}), f"lvl{level}." + path
    options: dict[str, Any] = {"page_size": page}
    if depth:
        options["attrs"] = [f"{path}k_buffer", f"{path}v_buffer"]
    forms = {kform, vform}
    flat = forms <= {"list", "tuple", "dict"}
    plain = flat and (layers == 1 or forms <= {"list", "tuple"} or forms == {"dict"})  # else: pairing is a guess
    expected = {"k": ks, "v": vs} if plain else None
    return Case(inner, options, expected, [*ks, *vs], bool(expected) and bool(ok), notes={"forms": forms})


@st.composite
def metadata_numbers(draw: st.DrawFn) -> Case:
    """Pool metadata (page_size, start_layer, layer_num) and options in every numeric type."""
    layers = draw(st.integers(1, 3))
    ks, vs, page, ok = _kv(draw, layers)
    start = draw(st.integers(0, 5))
    pool = SimpleNamespace(k_buffer=ks, v_buffer=vs)
    good = True
    for name, value in (("page_size", page), ("start_layer", start), ("layer_num", layers)):
        if draw(st.booleans()):
            number, readable = _number(draw, value)
            setattr(pool, name, number)
            good &= readable
    options: dict[str, Any] = {}
    if draw(st.booleans()) or not hasattr(pool, "page_size"):
        wrong = draw(st.booleans()) and hasattr(pool, "page_size")
        number, readable = _number(draw, page * 2 if wrong else page)
        options["page_size"] = number
        good &= readable and not wrong
    if not hasattr(pool, "start_layer"):
        start = 0
    expected = {"k": ks, "v": vs} if good else None
    return Case(pool, options, expected, [*ks, *vs], good and bool(ok), list(range(start, start + layers)))


class _Getters:
    """K/V exposed through properties: fresh copies (refused) or fresh views of the same memory (fine)."""

    def __init__(self, ks: list[torch.Tensor], vs: list[torch.Tensor], how: str, page: int) -> None:
        self._k, self._v, self._how, self.page_size = ks, vs, how, page

    def _read(self, ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return {
            "clone": lambda: [t.clone() for t in ts],
            "contiguous": lambda: [t.transpose(0, 1).contiguous().transpose(0, 1) for t in ts],
            "view": lambda: [t.view(t.shape) for t in ts],
            "slice": lambda: [t[:] for t in ts],
            "every-other": lambda: [t.clone() for t in ts] if self._odd(ts) else ts,
        }[self._how]()

    def _odd(self, ts: list[torch.Tensor]) -> bool:
        """Each attribute copies on its 1st, 3rd, ... read only (the second read returns the pool's memory)."""
        reads = self.__dict__.setdefault("_reads", {})
        reads[id(ts)] = reads.get(id(ts), 0) + 1
        return bool(reads[id(ts)] % 2)

    @property
    def k_buffer(self) -> list[torch.Tensor]:
        return self._read(self._k)

    @property
    def v_buffer(self) -> list[torch.Tensor]:
        return self._read(self._v)


@st.composite
def copying_getters(draw: st.DrawFn) -> Case:
    layers = draw(st.integers(1, 3))
    ks, vs, page, ok = _kv(draw, layers)
    how = draw(st.sampled_from(["clone", "contiguous", "view", "slice", "every-other"]))
    copies = how in ("clone", "every-other") or (how == "contiguous" and not ks[0].transpose(0, 1).is_contiguous())
    nested = draw(st.booleans())
    pool: Any = _Getters(ks, vs, how, page)
    options: dict[str, Any] = {}
    if nested:
        pool, options = SimpleNamespace(inner=pool), {"attrs": ["inner.k_buffer", "inner.v_buffer"], "page_size": page}
    expected = None if copies else {"k": ks, "v": vs}
    return Case(pool, options, expected, [*ks, *vs], not copies and bool(ok), notes={"how": how})
