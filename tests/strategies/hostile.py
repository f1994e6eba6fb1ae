"""Hypothesis strategies for hostile adapt() inputs (issue 8), part 2: raising attributes,
storage-less tensors, byte-buffer geometry. See :mod:`tests.strategies.cases` for :class:`Case`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from ..helpers import distinct
from .cases import DTYPE, Case, aligned_regions, draw_geometry

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
    heads, dim, page, rows = draw_geometry(draw)
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
    heads, dim, page, rows = draw_geometry(draw)
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
    must = aligned_regions(expected, page) and page * dims[3] * dims[4] * item % 8 == 0 and rows >= page
    return expected, must


@st.composite
def split_containers(draw: st.DrawFn) -> Case:
    """Separate K and V given as lists, dicts named by layer, or dicts of other names, in shuffled orders.

    The truth is the host's: layer ``ids[j]`` owns ``ks[j]`` and ``vs[j]``. A list (or a dict whose
    names carry no layer) lists layers in ascending order or in the order of the K dict, as its host
    believed; adapt() cannot tell which, so it must pair by names or refuse. ``expected`` is in
    ascending id order; :func:`check_split` holds a view to the truth whatever order it chose.
    """
    n = draw(st.integers(1, 3))
    ids = sorted(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n, unique=True)))
    heads, dim, page = draw(st.integers(1, 2)), draw(st.sampled_from([2, 4])), draw(st.sampled_from([2, 4]))
    rows = page * draw(st.integers(1, 2)) + draw(st.integers(0, 1))
    ks = [distinct((rows, heads, dim), DTYPE, 1000 * j) for j in range(n)]
    vs = [distinct((rows, heads, dim), DTYPE, 1000 * j + 500) for j in range(n)]
    perm = draw(st.permutations(range(n)))  # a named K dict's insertion order
    positional = draw(st.sampled_from([list(range(n)), list(perm)]))  # lists and other-name dicts share one order
    forms = [draw(st.sampled_from(["named", "list", "other-names", "shared-names"])) for _ in "kv"]
    containers, k_order = [], list(perm if forms[0] == "named" else positional)
    for plane, ts, form in (("k", ks, forms[0]), ("v", vs, forms[1])):
        if form == "named":
            order = perm if plane == "k" else draw(st.permutations(range(n)))
            value: Any = {f"model.layers.{ids[j]}.attn.{plane}": ts[j] for j in order}
        elif form == "list":
            value = [ts[j] for j in positional]
        elif form == "shared-names":
            value = {f"blk{chr(97 + j)}": ts[j] for j in positional}
        else:  # names without a layer index, in an order of their own: position says nothing
            value = {f"{plane}.blk{chr(97 + j)}": ts[j] for j in draw(st.permutations(range(n)))}
        containers.append(value)
    pool = SimpleNamespace(k_buffer=containers[0], v_buffer=containers[1], page_size=page)
    options: dict[str, Any] = {}
    if draw(st.booleans()):  # the true ids, in the K container's order
        options["layer_ids"] = [ids[j] for j in k_order]
    must = forms == ["list", "list"] and rows >= page
    expected = {"k": ks, "v": vs}
    return Case(pool, options, expected, [*ks, *vs], must, ids, notes={"k_order": k_order})


def check_split(view: Any, case: Case) -> None:
    """Each exposed layer is one host layer: its K and V, labelled with its id where ids are known."""
    assert case.expected is not None and case.layer_ids is not None
    ks, vs = case.expected["k"], case.expected["v"]
    named = "layer_ids" in case.options or any(
        isinstance(c, dict) and "layers" in next(iter(c)) for c in (case.pool.k_buffer, case.pool.v_buffer)
    )
    seen = []
    for i, (k, v) in enumerate(zip(view.k_buffer, view.v_buffer)):
        j = next(j for j, t in enumerate(ks) if t.data_ptr() == k.data_ptr())
        assert v.data_ptr() == vs[j].data_ptr(), f"view layer {i}: K of host layer {j} beside another layer's V"
        assert torch.equal(k, ks[j][: k.shape[0]]) and torch.equal(v, vs[j][: v.shape[0]])
        if named:
            assert view.layer_ids[i] == case.layer_ids[j], f"view layer {i} is host layer {case.layer_ids[j]}"
        seen.append(j)
    assert sorted(seen) == list(range(len(ks))), "a layer was dropped or exposed twice"


@st.composite
def strided_tensors(draw: st.DrawFn) -> Case:
    """One ``[L, 2, N, H, D]`` tensor made with ``as_strided`` over a small buffer: any strides, zero
    (broadcast rows, heads or layers that alias the same bytes) and overlapping ones included.

    ``expected`` is the logical region of each layer's K and V; a view that passes must hold it
    where FlexKV reads it (``data_ptr + b * block_bytes``), not only through its strides.
    """
    shape = (draw(st.integers(1, 2)), 2, draw(st.integers(2, 4)), draw(st.integers(1, 2)), 2)
    tight = [0] * 5
    size = 1
    for d in range(4, -1, -1):
        tight[d], size = size, size * shape[d]
    strides = [draw(st.sampled_from([tight[d], tight[d], 0, 1, 2, tight[d] // 2 or 1, tight[d] + 2])) for d in range(5)]
    offset = draw(st.sampled_from([0, 2, 4]))
    span = offset + sum((s - 1) * st_ for s, st_ in zip(shape, strides)) + 1
    base = distinct((span,), DTYPE)
    t = base.as_strided(shape, strides, offset)
    layers = shape[0]
    expected = {"k": [t[i, 0] for i in range(layers)], "v": [t[i, 1] for i in range(layers)]}
    page = draw(st.sampled_from([1, 2]))
    options: dict[str, Any] = {"page_size": page, "axes": "L KV N H D"}
    return Case(t, options, expected, [base], notes={"strides": strides, "offset": offset})
