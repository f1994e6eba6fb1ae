"""Hypothesis strategies for hostile adapt() inputs (issue 8).

Each strategy draws a tiny pool together with what a correct view must alias, so a test can hold
adapt() to "exactly the right elements, or an AdapterError". A case is a :class:`Case`:
``expected`` maps plane -> per-layer source regions (None: any view is wrong, an error is due),
``must_succeed`` marks inputs that are fully specified and FlexKV-addressable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from .helpers import assert_aliases, distinct

DTYPE = torch.int32  # 4 bytes: FlexKV's 8-byte block rule bites when page * heads * dim is odd


@dataclass
class Case:
    pool: Any
    options: dict[str, Any]
    expected: dict[str, list[torch.Tensor]] | None
    roots: list[torch.Tensor]
    must_succeed: bool = False
    layer_ids: list[int] | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def _ok(page: int, heads: int, *dims: int, itemsize: int = 4) -> bool:
    return all(page * heads * d * itemsize % 8 == 0 for d in dims)


def aligned_regions(expected: dict[str, list[torch.Tensor]], page: int) -> bool:
    """Every region's base meets FlexKV's kernel: 8-byte words, 16-byte loads when a block allows them."""
    return all(
        r.data_ptr() % (16 if page * r[0].numel() * r.element_size() % 16 == 0 else 8) == 0
        for regions in expected.values()
        for r in regions
    )


def check_view(view: Any, case: Case) -> None:
    """The view aliases exactly ``case.expected`` (values, then a write through the view)."""
    assert case.expected is not None, f"adapt accepted an input that must be refused: {case.notes}"
    planes = {"kv": view.kv_buffer} if view.report.kind == "mla" else {"k": view.k_buffer, "v": view.v_buffer}
    assert set(planes) == set(case.expected)
    rows = view.report.aligned_rows
    assert rows % view.page_size == 0 and view.report.bytes_copied == 0
    for plane, views in planes.items():
        assert len(views) == len(case.expected[plane])
        for got, region in zip(views, case.expected[plane]):
            region = region if region.ndim == 4 else region[:rows]  # paged regions are whole pages
            root = next(r for r in case.roots if r.untyped_storage().data_ptr() == got.untyped_storage().data_ptr())
            assert got.is_contiguous()
            if root.dtype == got.dtype:
                assert_aliases(got.view(region.shape), region, root)
            else:
                _assert_aliases_bytes(got.view(region.shape), region, root)
    if case.layer_ids is not None:
        assert view.layer_ids == case.layer_ids


def _assert_aliases_bytes(view: torch.Tensor, region: torch.Tensor, root: torch.Tensor) -> None:
    """``assert_aliases`` for a typed view of a byte root: the bytes a write changes lie in ``region``."""
    assert torch.equal(view, region)
    before = root.clone()
    view.fill_(-7 if view.dtype.is_signed else 7)
    assert torch.equal(region, torch.full_like(region, -7 if region.dtype.is_signed else 7))
    changed = (root != before).nonzero().flatten()
    start = region.data_ptr() - root.data_ptr()
    assert changed.numel() > 0 and start <= int(changed.min()) and int(changed.max()) < start + region.nbytes
    root.copy_(before)


def draw_geometry(draw: st.DrawFn) -> tuple[int, int, int, int]:
    heads, dim, page = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    rows = page * draw(st.integers(1, 3)) + draw(st.integers(0, page - 1))
    return heads, dim, page, rows


@st.composite
def pair_confusions(draw: st.DrawFn) -> Case:
    """(k, v) pairs, [k_list, v_list], [K_all, V_all] and per-layer [2, N, H, D] lists, 1-3 layers."""
    form = draw(st.sampled_from(["pairs", "kv-lists", "kv-tensors", "per-layer-kv"]))
    layers = draw(st.integers(1, 3))
    heads, dim, page, rows = draw_geometry(draw)
    v_dim = draw(st.sampled_from([dim, dim, 2 * dim]))
    outer, inner = draw(st.sampled_from([list, tuple])), draw(st.sampled_from([list, tuple]))
    if form == "kv-tensors":
        k_all = distinct((layers, rows, heads, dim), DTYPE)
        v_all = distinct((layers, rows, heads, v_dim), DTYPE, 50_000)
        pool, roots = outer([k_all, v_all]), [k_all, v_all]
        expected = {"k": list(k_all.unbind(0)), "v": list(v_all.unbind(0))}
    elif form == "per-layer-kv":
        ts = [distinct((2, rows, heads, dim), DTYPE, 1000 * i) for i in range(layers)]
        pool, roots, expected = outer(ts), ts, {"k": [t[0] for t in ts], "v": [t[1] for t in ts]}
        v_dim = dim
    else:
        ks = [distinct((rows, heads, dim), DTYPE, 1000 * i) for i in range(layers)]
        vs = [distinct((rows, heads, v_dim), DTYPE, 1000 * i + 500) for i in range(layers)]
        pairs = [inner((k, v)) for k, v in zip(ks, vs)]
        pool = outer(pairs) if form == "pairs" else outer([inner(ks), inner(vs)])
        roots, expected = [*ks, *vs], {"k": ks, "v": vs}
    options: dict[str, Any] = {"page_size": page}
    if draw(st.booleans()):
        per_layer = draw(st.sampled_from(["KV N H D", "L KV N H D"]))
        options["axes"] = {"pairs": "L KV N H D", "per-layer-kv": per_layer}.get(form, "KV L N H D")
    if draw(st.booleans()):
        options["layer_num"] = layers
    must = "axes" in options and _ok(page, heads, dim, v_dim) and rows >= page and aligned_regions(expected, page)
    return Case(pool, options, expected, roots, must, notes={"form": form})


@st.composite
def extent_mismatches(draw: st.DrawFn) -> Case:
    """Per-layer pools where one layer (not the first) has a different K/V, token, head or dim extent."""
    form = draw(st.sampled_from(["kv_cache", "vllm-dict", "k/v lists", "pairs"]))
    layers = draw(st.integers(2, 4))
    heads, dim, page, rows = draw_geometry(draw)
    npages = max(rows // page, 1)
    shape, axes = {
        "kv_cache": ((2, rows, heads, dim), "KV N H D"),
        "vllm-dict": ((2, npages, page, heads, dim), "KV P T H D"),
        "k/v lists": ((rows, heads, dim), "N H D"),
        "pairs": ((rows, heads, dim), "L KV N H D"),
    }[form]
    odd_layer = draw(st.integers(1, layers - 1))
    bumped = draw(st.sampled_from([i for i, a in enumerate(axes.split()[-len(shape) :]) if a not in ("N", "P", "L")]))
    odd = tuple(s + draw(st.integers(1, 3)) if i == bumped else s for i, s in enumerate(shape))
    ts = [distinct(odd if i == odd_layer else shape, DTYPE, 1000 * i) for i in range(layers)]
    vs = [distinct(shape, DTYPE, 1000 * i + 500) for i in range(layers)]
    pool: Any = {
        "kv_cache": SimpleNamespace(kv_cache=ts),
        "vllm-dict": {f"model.layers.{i}.attn": t for i, t in enumerate(ts)},
        "k/v lists": SimpleNamespace(k_cache=ts, v_cache=vs),
        "pairs": list(zip(ts, vs)),
    }[form]
    options: dict[str, Any] = {"page_size": page}
    if draw(st.booleans()):
        options["axes"] = axes
    return Case(pool, options, None, [*ts, *vs], notes={"form": form, "layer": odd_layer, "axis": bumped})


_MARKERS = ("main_pool", "full_kv_pool", "swa_kv_pool", "mamba_pool", "unified_kv_pool")


@st.composite
def markers_next_to_attrs(draw: st.DrawFn) -> Case:
    """A pool whose KV tensors are named with attrs= while it also carries hybrid-marker attributes."""
    heads, dim, page, rows = draw_geometry(draw)
    layers = draw(st.integers(1, 3))
    ks = [distinct((rows, heads, dim), DTYPE, 1000 * i) for i in range(layers)]
    vs = [distinct((rows, heads, dim), DTYPE, 1000 * i + 500) for i in range(layers)]
    names = draw(st.sampled_from([("k_buffer", "v_buffer"), ("key_cache", "value_cache"), ("mine_k", "mine_v")]))
    nested = draw(st.booleans())
    holder = SimpleNamespace(**dict(zip(names, (ks, vs))))
    pool = SimpleNamespace(inner=holder) if nested else holder
    decoys = [distinct((rows, heads, dim), DTYPE, 90_000 + 100 * i) for i in range(2)]
    decoy = SimpleNamespace(k_buffer=[decoys[0]] * layers, v_buffer=[decoys[1]] * layers, model_layer_ids=[0])
    for marker in draw(st.lists(st.sampled_from(_MARKERS), min_size=1, max_size=3, unique=True)):
        setattr(pool, marker, decoy)
    if draw(st.booleans()):
        pool.layers_mapping = {i: (i, False) for i in range(layers)}
        pool.full_attention_layer_id_mapping = {0: 0}
    attrs = [f"inner.{n}" for n in names] if nested else list(names)
    options: dict[str, Any] = {"page_size": page, "attrs": attrs}
    if draw(st.booleans()):
        options["hybrid"] = draw(st.sampled_from(["error", "attention_only"]))
    must = _ok(page, heads, dim) and rows >= page
    return Case(pool, options, {"k": ks, "v": vs}, [*ks, *vs, *decoys], must)


@st.composite
def shuffled_dicts(draw: st.DrawFn) -> Case:
    """vLLM dicts with names in shuffled order, plus layer_ids= right, wrong or needed; maybe start_layer."""
    n = draw(st.integers(1, 4))
    ids = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
    heads, dim = draw(st.integers(1, 3)), draw(st.sampled_from([2, 4]))
    page, npages = draw(st.sampled_from([4, 8])), draw(st.sampled_from([1, 3]))  # 2 pages would read as K/V
    named = draw(st.sampled_from([True, False]))  # hypothesis favours the first choice: the common case
    keys = [f"model.layers.{i}.self_attn" if named else f"enc.block{chr(97 + j)}" for j, i in enumerate(ids)]
    ts = [distinct((2, npages, page, heads, dim), DTYPE, 10_000 * j) for j in range(n)]
    pool = dict(zip(keys, ts))
    mode = draw(st.sampled_from(["right", "none", "wrong"]))
    options: dict[str, Any] = {"page_size": page, "head_num": heads}
    if mode == "right":
        options["layer_ids"] = ids
    elif mode == "wrong":
        wrong = draw(st.permutations(ids)) if n > 1 else [ids[0] + 1]
        options["layer_ids"] = wrong
    start = draw(st.booleans()) and draw(st.booleans())
    if start:
        options["start_layer"] = draw(st.integers(0, 3))
    given = options.get("layer_ids")
    if named:
        wrong_ids = given is not None and list(given) != ids
        order = sorted(range(n), key=lambda j: ids[j])
        labels = [ids[j] for j in order]
    else:  # ids come only from layer_ids=, in the dict's order
        wrong_ids, order, labels = given is None, list(range(n)), list(given or [])
    expected = None if start or wrong_ids else {"k": [ts[j][0] for j in order], "v": [ts[j][1] for j in order]}
    return Case(pool, options, expected, ts, expected is not None, labels, {"named": named, "mode": mode})
