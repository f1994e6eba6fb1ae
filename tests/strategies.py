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


def _aligned(expected: dict[str, list[torch.Tensor]]) -> bool:
    return all(r.data_ptr() % 8 == 0 for regions in expected.values() for r in regions)


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


def _geometry(draw: st.DrawFn) -> tuple[int, int, int, int]:
    heads, dim, page = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    rows = page * draw(st.integers(1, 3)) + draw(st.integers(0, page - 1))
    return heads, dim, page, rows


@st.composite
def pair_confusions(draw: st.DrawFn) -> Case:
    """(k, v) pairs, [k_list, v_list], [K_all, V_all] and per-layer [2, N, H, D] lists, 1-3 layers."""
    form = draw(st.sampled_from(["pairs", "kv-lists", "kv-tensors", "per-layer-kv"]))
    layers = draw(st.integers(1, 3))
    heads, dim, page, rows = _geometry(draw)
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
    must = "axes" in options and _ok(page, heads, dim, v_dim) and rows >= page and _aligned(expected)
    return Case(pool, options, expected, roots, must, notes={"form": form})


@st.composite
def extent_mismatches(draw: st.DrawFn) -> Case:
    """Per-layer pools where one layer (not the first) has a different K/V, token, head or dim extent."""
    form = draw(st.sampled_from(["kv_cache", "vllm-dict", "k/v lists", "pairs"]))
    layers = draw(st.integers(2, 4))
    heads, dim, page, rows = _geometry(draw)
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
    heads, dim, page, rows = _geometry(draw)
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


_PROBED = (
    "page_size",
    "head_num",
    "head_dim",
    "layer_num",
    "start_layer",
    "dtype",
    "kv_cache_layout",
    "full_kv_pool",
    "swa_kv_pool",
    "main_pool",
    "mamba_pool",
    "register_mapping",
    "full_to_hisparse_device_index_mapping",
    "model_layer_ids",
    "k_scale_buffer",
    "kv_cache",
    "kv_buffer",
    "v_buffer",
)


@st.composite
def raising_attributes(draw: st.DrawFn) -> Case:
    """A valid MHA pool one of whose attributes raises when read (or whose __getattr__ raises/recurses)."""
    heads, dim, page, rows = _geometry(draw)
    layers = draw(st.integers(1, 3))
    ks = [distinct((rows, heads, dim), DTYPE, 1000 * i) for i in range(layers)]
    vs = [distinct((rows, heads, dim), DTYPE, 1000 * i + 500) for i in range(layers)]
    exc = draw(st.sampled_from([RuntimeError, AssertionError, KeyError, TypeError, AttributeError, RecursionError]))

    def boom(self: object) -> None:
        raise exc("hostile")

    how = draw(st.sampled_from(["property"] * 6 + ["getattr", "recursive"]))  # recursion is slow: rarer
    body: dict[str, Any] = {}
    raising = draw(st.sampled_from(_PROBED)) if how == "property" else None
    if raising:
        body[raising] = property(boom)
    elif how == "getattr":
        body["__getattr__"] = lambda self, name: boom(self)
    else:
        body["__getattr__"] = lambda self, name: getattr(self, name)
    pool = type("HostilePool", (), body)()
    pool.k_buffer = ks
    if raising != "v_buffer":
        pool.v_buffer = vs
    if raising != "page_size" and draw(st.booleans()):
        pool.page_size = page
    return Case(pool, {"page_size": page}, {"k": ks, "v": vs}, [*ks, *vs], notes={"how": how, "exc": exc})


def _no_storage(t: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "meta":
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    if kind == "coo":
        return t.to_sparse()
    if kind == "empty":
        return t[..., :0]
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(t.shape, dtype=t.dtype)


@st.composite
def storage_less(draw: st.DrawFn) -> Case:
    """Valid pools in which one tensor (or all) has no real memory: meta, fake, sparse, empty."""
    heads, dim, page, rows = _geometry(draw)
    layers = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["meta", "meta", "coo", "fake", "empty"]))
    form = draw(st.sampled_from(["k/v lists", "kv list", "dict", "flat", "pairs"]))
    shape = {"k/v lists": (rows, heads, dim), "pairs": (rows, heads, dim), "flat": (layers, 2, rows, heads, dim)}.get(
        form, (2, rows, heads, dim)
    )
    ts = [distinct(shape, DTYPE, 1000 * i) for i in range(1 if form == "flat" else layers)]
    victim = draw(st.integers(0, len(ts) - 1))
    everywhere = draw(st.booleans())
    ts = [_no_storage(t, kind) if everywhere or i == victim else t for i, t in enumerate(ts)]
    pool: Any = {
        "k/v lists": SimpleNamespace(k_buffer=ts, v_buffer=ts),
        "kv list": SimpleNamespace(kv_cache=ts),
        "dict": {f"layers.{i}.attn": t for i, t in enumerate(ts)},
        "flat": ts[0],
        "pairs": [(t, t) for t in ts],
    }[form]
    options: dict[str, Any] = {"page_size": page}
    if draw(st.booleans()) and form != "pairs":
        options["axes"] = {"k/v lists": "N H D", "flat": "L KV N H D"}.get(form, "KV N H D")
    return Case(pool, options, None, [], notes={"kind": kind, "form": form})


_SIZE = st.one_of(st.integers(-3, 6), st.sampled_from([2, 2, -1]), st.sampled_from(["a", 1.5, None, True]))
_DTYPES = [torch.float32, torch.int16, torch.int64, torch.uint8]


@st.composite
def _well_formed(draw: st.DrawFn, dtype: torch.dtype) -> tuple[list[int], int, int]:
    """A declaration that fits: (shape, offset, buffer bytes); one size may be -1."""
    dims = [draw(st.integers(1, 2)), 2, draw(st.integers(1, 8)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 4]))]
    offset = draw(st.sampled_from([0, 0, 8, 16, 24, 4, 2]))
    need = dtype.itemsize
    for d in dims:
        need *= d
    total = offset + need + draw(st.sampled_from([0, 0, 1, 7, 64]))
    if draw(st.booleans()):
        dims[draw(st.sampled_from([0, 2, 3, 4]))] = -1
    return dims, offset, total


@st.composite
def byte_buffers(draw: st.DrawFn) -> Case:
    """A 1-D byte buffer (maybe a slice at an odd storage offset) with well-formed or hostile geometry."""
    dtype = draw(st.sampled_from(_DTYPES))
    lead = draw(st.sampled_from([0, 0, 0, 8, 1, 2, 4]))
    shape: Any
    offset: Any
    if draw(st.sampled_from([True, False])):
        shape, offset, total = draw(_well_formed(dtype))
    else:
        total = draw(st.integers(0, 700))
        shape = draw(st.one_of(st.lists(_SIZE, min_size=5, max_size=5), st.sampled_from([5, "2,2", None])))
        offset = draw(st.one_of(st.integers(-8, 720), st.sampled_from([1.5, True, "8"])))
    root = distinct((total + lead,), torch.uint8)
    buf = root[lead:]
    page = draw(st.sampled_from([1, 2, 4]))
    options: dict[str, Any] = {"page_size": page, "dtype": dtype, "axes": "L KV N H D", "shape": shape}
    options["offset"] = offset
    expected, must = _byte_expected(buf, shape, offset, dtype, page)
    return Case(buf, options, expected, [root], must, notes={"lead": lead, "total": total})


def _byte_expected(
    buf: torch.Tensor, shape: Any, offset: Any, dtype: torch.dtype, page: int
) -> tuple[dict[str, list[torch.Tensor]] | None, bool]:
    """What a correct view holds, computed from the declaration alone (None: it must be refused)."""
    ints = isinstance(shape, list) and all(type(s) is int for s in shape)
    if not ints or type(offset) is not int or offset < 0 or shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        return None, False
    item = dtype.itemsize
    known = 1
    for s in shape:
        known *= s if s != -1 else 1
    dims = [(buf.numel() - offset) // item // known if s == -1 else s for s in shape]
    need = item
    for s in dims:
        need *= s
    if (
        need <= 0
        or offset + need > buf.numel()
        or (buf.storage_offset() + offset) % item
        or dims[1] != 2
        or dims[2] < page
    ):
        return None, False
    arr = buf[offset : offset + need].view(dtype).view(dims)
    layers, rows = dims[0], dims[2] - dims[2] % page
    expected = {"k": [arr[i, 0] for i in range(layers)], "v": [arr[i, 1] for i in range(layers)]}
    must = _aligned(expected) and page * dims[3] * dims[4] * item % 8 == 0 and rows >= page
    return expected, must
