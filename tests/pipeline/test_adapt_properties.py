"""Property: adapt() returns views aliasing exactly the right elements, or raises AdapterError.

Hypothesis draws geometries, dtypes, physical orders, containers and attribute names. The test
knows the true layout of what it built, so it computes each layer's expected K/V region itself
and compares element by element (values are pairwise distinct), then writes through the view.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, note
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt

from ..helpers import assert_aliases, distinct

# order name -> (kind, per-layer?, axes)
ORDERS = {
    "split": ("mha", True, "N H D"),
    "kv-pairs": ("mha", True, "KV N H D"),
    "vllm-kv-first": ("mha", True, "KV P T H D"),
    "vllm-blocks-first": ("mha", True, "P KV T H D"),
    "hnd": ("mha", True, "KV P H T D"),
    "mla": ("mla", True, "N H D"),
    "flat-layer-first": ("mha", False, "L KV N H D"),
    "flat-kv-first": ("mha", False, "KV L N H D"),
    "flat-token-major": ("mha", False, "N L KV H D"),
    "flat-mla": ("mla", False, "L N D"),
}
DTYPES = [torch.float32, torch.int32, torch.int64, torch.float64, torch.int16]


def _expected(order, s, layers, v=None):
    """Per plane, per layer, the [rows, H, D] region of the source the view must alias."""

    def pages(x):  # [P, T, H, D], kept 4-D: flattening a non-contiguous view would copy
        return x

    if order == "split":
        return {"k": list(s), "v": list(v)}
    if order == "kv-pairs":
        return {"k": [t[0] for t in s], "v": [t[1] for t in s]}
    if order == "vllm-kv-first":
        return {"k": [pages(t[0]) for t in s], "v": [pages(t[1]) for t in s]}
    if order == "vllm-blocks-first":
        return {"k": [pages(t[:, 0]) for t in s], "v": [pages(t[:, 1]) for t in s]}
    if order == "hnd":
        return {"k": [pages(t[0].transpose(1, 2)) for t in s], "v": [pages(t[1].transpose(1, 2)) for t in s]}
    if order == "mla":
        return {"kv": list(s)}
    if order == "flat-layer-first":
        return {"k": [s[i, 0] for i in range(layers)], "v": [s[i, 1] for i in range(layers)]}
    if order == "flat-kv-first":
        return {"k": [s[0, i] for i in range(layers)], "v": [s[1, i] for i in range(layers)]}
    if order == "flat-token-major":
        return {"k": [s[:, i, 0] for i in range(layers)], "v": [s[:, i, 1] for i in range(layers)]}
    return {"kv": [s[i].unsqueeze(1) for i in range(layers)]}  # flat-mla


@st.composite
def pools(draw):
    order = draw(st.sampled_from(sorted(ORDERS)))
    kind, per_layer, axes = ORDERS[order]
    layers = draw(st.integers(1, 4))
    heads = 1 if kind == "mla" else draw(st.integers(1, 5))
    dim = draw(st.integers(1, 9))
    page = draw(st.sampled_from([1, 2, 4, 8, 16]))
    npages = draw(st.integers(1, 4))
    paged = "P" in axes
    rows = npages * page + (0 if paged else draw(st.integers(0, page - 1)))
    dtype = draw(st.sampled_from(DTYPES))
    shape = {
        "split": (rows, heads, dim),
        "kv-pairs": (2, rows, heads, dim),
        "vllm-kv-first": (2, npages, page, heads, dim),
        "vllm-blocks-first": (npages, 2, page, heads, dim),
        "hnd": (2, npages, heads, page, dim),
        "mla": (rows, 1, dim),
        "flat-layer-first": (layers, 2, rows, heads, dim),
        "flat-kv-first": (2, layers, rows, heads, dim),
        "flat-token-major": (rows, layers, 2, heads, dim),
        "flat-mla": (layers, rows, dim),
    }[order]
    if per_layer:
        src = [distinct(shape, dtype, 20_000 * i) for i in range(layers)]
        v_src = [distinct(shape, dtype, 20_000 * i + 10_000) for i in range(layers)] if order == "split" else None
    else:
        src, v_src = distinct(shape, dtype), None
    options = {}
    if draw(st.booleans()):
        options["axes"] = axes
    for name, value in (("layer_num", layers), ("head_num", heads if kind == "mha" else None), ("head_dim", dim)):
        if value is not None and kind == "mha" and draw(st.booleans()):
            options[name] = value
    if not paged or draw(st.booleans()):
        options["page_size"] = page
    if order == "split":
        k_name, v_name = draw(
            st.sampled_from(
                [
                    ("k_buffer", "v_buffer"),
                    ("k_cache", "v_cache"),
                    ("key_cache", "value_cache"),
                    ("k_buffers", "v_buffers"),
                ]
            )
        )
        pool = SimpleNamespace(**{k_name: src, v_name: v_src})
    elif per_layer:
        container = draw(st.sampled_from(["list", "tuple", "dict", "attr"]))
        if container == "dict":
            pool = {f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(src)}
        elif container == "attr":
            name = draw(st.sampled_from(["kv_buffer"] if kind == "mla" else ["kv_cache", "kv_caches"]))
            pool = SimpleNamespace(**{name: src})
        else:
            pool = list(src) if container == "list" else tuple(src)
    else:
        pool = src if draw(st.booleans()) else SimpleNamespace(kv_cache=src)
    expected = _expected(order, src, layers, v_src)
    aligned = rows - rows % page
    chunk = page * heads * dim * dtype.itemsize
    word = 16 if chunk % 16 == 0 else 8  # FlexKV's kernel loads 16-byte words when the chunk allows it
    flexkv_ok = chunk % 8 == 0 and all(
        (r if paged else r[:aligned]).is_contiguous() and r.data_ptr() % word == 0
        for regions in expected.values()
        for r in regions
    )
    must_succeed = "axes" in options and flexkv_ok
    return order, pool, options, expected, must_succeed, (src, v_src), paged


@given(pools())  # examples: the profile in conftest.py (2,000, derandomized)
def test_adapt_aliases_exactly_the_right_elements_or_raises_adapter_error(case):
    order, pool, options, expected, must_succeed, (src, v_src), paged = case
    note(f"order={order} options={options}")
    try:
        view = adapt(pool, **options)
    except AdapterError:
        assert not must_succeed, "adapt refused a layout it was told exactly and FlexKV can address"
        return
    planes = {"kv": view.kv_buffer} if view.report.kind == "mla" else {"k": view.k_buffer, "v": view.v_buffer}
    assert set(planes) == set(expected)
    rows = view.report.aligned_rows
    assert rows % view.page_size == 0 and view.num_blocks == rows // view.page_size
    roots = [*src, *(v_src or [])] if isinstance(src, list) else [src]
    for plane, views in planes.items():
        assert len(views) == len(expected[plane])
        for got, region in zip(views, expected[plane]):
            region = region if paged else region[:rows]
            assert got.is_contiguous() and region.is_contiguous(), "FlexKV would misread this view"
            root = next(r for r in roots if r.untyped_storage().data_ptr() == got.untyped_storage().data_ptr())
            assert_aliases(got.view(region.shape), region, root)
    assert view.report.bytes_copied == 0
