"""Pools whose layers are easy to misread, as :class:`~tests.strategies.cases.Case` s.

K/V pairs that could be confused, extents that disagree, pool markers next to attrs=, shuffled dicts,
layer views over shared bytes on the general path (row for row: fine; rows shifted: refused), and dicts
whose keys are hostile (raising or huge ``__str__``/``__repr__``, non-str keys) with ``layer_ids=`` right,
wrong or absent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from ..helpers import distinct
from .cases import DTYPE, Case, _ok, aligned_regions, draw_geometry


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
