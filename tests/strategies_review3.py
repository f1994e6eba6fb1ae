"""Hypothesis strategies for the third review's classes (issue 17), as :class:`~tests.strategies.Case` s.

Each draws a tiny pool and what a correct view must alias (``expected=None``: an AdapterError is due):
containers nested in containers, metadata in every numeric type, getters that copy (or that return
fresh views of the same memory, which is fine), vLLM dicts with distinct views over shared bytes (HMA)
or true KV sharing (the same object), and vLLM dict entries without a layer index.
"""

from __future__ import annotations

from decimal import Decimal
from enum import IntEnum
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from .helpers import distinct
from .strategies import DTYPE, Case, _ok, aligned_regions, draw_geometry


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


def _vllm_mla(layers: int, blocks: int, tokens: int, content: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """vLLM 0.33 LBNHC MLA views (one head) over one buffer of distinct values: the root and the views."""
    root = distinct((layers, blocks, tokens, 1, content), DTYPE)
    return root, [root[i].permute(0, 2, 1, 3) for i in range(layers)]  # [B, H=1, N, C]


@st.composite
def shared_byte_dicts(draw: st.DrawFn) -> Case:
    """vLLM dicts where a later layer reuses an earlier slot: the same object (KV sharing) or a distinct view."""
    layers, blocks = draw(st.integers(1, 3)), draw(st.sampled_from([1, 3, 4]))
    tokens, content = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([2, 4]))
    root, per_layer = _vllm_mla(layers, blocks, tokens, content)
    names = [f"model.layers.{i}.attn" for i in range(layers)]
    kv = dict(zip(names, per_layer))
    same = draw(st.booleans())
    target = draw(st.integers(0, layers - 1))
    t = per_layer[target]
    kv[f"model.layers.{layers}.attn"] = t if same else t.as_strided(t.shape, t.stride(), t.storage_offset())
    regions = [v.permute(0, 2, 1, 3).reshape(blocks * tokens, 1, content) for v in kv.values()]
    expected = {"kv": regions} if same else None
    ok = tokens * content * 4 % 8 == 0 and aligned_regions({"kv": regions}, tokens)
    options = {"page_size": tokens, "kind": "mla"}
    ids = list(range(layers + 1))
    return Case(kv, options, expected, [root], same and ok and blocks != 2, ids, {"same": same})


@st.composite
def unlabelled_entries(draw: st.DrawFn) -> Case:
    """vLLM dicts where some names hold no layer index (``mtp.attn``), with layer_ids= right, wrong or absent."""
    layers = draw(st.integers(1, 3))
    root, per_layer = _vllm_mla(layers, 3, 2, 4)
    ids = draw(st.lists(st.integers(0, 30), min_size=layers, max_size=layers, unique=True))
    unnamed = draw(st.lists(st.booleans(), min_size=layers, max_size=layers))
    names = [f"mtp{j}.attn" if u else f"model.layers.{i}.attn" for j, (i, u) in enumerate(zip(ids, unnamed))]
    kv = dict(zip(names, per_layer))
    mode = draw(st.sampled_from(["right", "none", "wrong"]))
    options: dict[str, Any] = {"page_size": 2, "kind": "mla"}
    if mode == "right":
        options["layer_ids"] = ids
    elif mode == "wrong":
        options["layer_ids"] = [i + 100 for i in ids]
    named_ok = not any(unnamed)
    good = mode == "right" or (mode == "none" and named_ok) or (mode == "wrong" and all(unnamed))
    labels = [i + 100 for i in ids] if mode == "wrong" else ids
    regions = [v.permute(0, 2, 1, 3).reshape(6, 1, 4) for v in per_layer]
    expected = {"kv": regions} if good else None
    return Case(kv, options, expected, [root], good, labels if good else None, {"mode": mode, "unnamed": unnamed})
