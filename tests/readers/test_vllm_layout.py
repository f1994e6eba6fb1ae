"""vLLM 0.33-style per-layer views over one buffer, generated for every layout and size (no vLLM needed).

The views are built as vLLM 0.33 builds them: a permuted [L, B, H, N, C] backing, one [B, H, N, C]
view per layer, kernel blocks splitting a manager block. Whatever plan() accepts, FlexKV's address
model must read byte for byte; what must be accepted is accepted.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from flexkv_adapter import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    MLAView,
    NotAddressableError,
    adapt,
)
from flexkv_adapter.flexkv import plan
from flexkv_adapter.flexkv.vllm_plan import plan_vllm
from flexkv_adapter.readers.vllm_layout import LAYOUTS, is_vllm_dict

from ..helpers import distinct, flexkv_worker_read


def views(layout: str, layers: int, blocks: int, heads: int, tokens: int, content: int, dtype=torch.bfloat16):
    order = LAYOUTS[layout]
    extents = (layers, blocks, heads, tokens, content)
    raw = torch.randint(0, 256, (layers * blocks * heads * tokens * content * dtype.itemsize,), dtype=torch.uint8)
    physical = raw.view(dtype).view(*(extents[a] for a in order))
    logical = physical.permute(*(order.index(a) for a in range(5)))
    return {f"model.layers.{i}.attn": logical[i] for i in range(layers)}


def chunk_bytes(view: torch.Tensor, block: int, tokens: int) -> bytes:
    ratio = tokens // view.shape[2]
    part = view[block * ratio : (block + 1) * ratio].permute(0, 2, 1, 3).reshape(tokens, view.shape[1], view.shape[3])
    return bytes(part.contiguous().view(torch.uint8).flatten().tolist())


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    layers=st.integers(1, 3),
    blocks=st.integers(1, 4),
    heads=st.integers(1, 3),
    tokens=st.sampled_from([1, 2, 4]),
    content=st.sampled_from([4, 8, 12]),
    ratio=st.sampled_from([1, 2]),
)
def test_whatever_is_accepted_is_read_byte_for_byte(layout, layers, blocks, heads, tokens, content, ratio):
    if layout.startswith("B") and ratio > 1:
        ratio = 1  # vLLM never splits block-outermost layouts into kernel blocks
    kv_caches = views(layout, layers, blocks * ratio, heads, tokens, content)
    kind = "mha" if heads > 1 else "mla"
    try:
        p = plan_vllm(kv_caches, kind=kind, block_size=tokens * ratio)
    except NotAddressableError as exc:
        assert "VLLM_KV_CACHE_LAYOUT" in str(exc)
        addressable = heads == 1 or layout in ("LBNHC", "BLNHC")  # blocks are token-major runs of bytes
        assert not addressable, f"refused an addressable {layout} cache: {exc}"
        return
    assert p.num_block == blocks and p.tokens_per_block == tokens * ratio
    for layer, view in enumerate(kv_caches.values()):
        for block in range(blocks):
            got = flexkv_worker_read(p.layout_fields(), list(p.tensors), layer, 0, block)
            assert got == chunk_bytes(view, block, tokens * ratio), (layer, block)


def test_one_head_at_tp2_needs_the_kind_and_multi_head_mla_is_inconsistent():
    one_head = views("LBNHC", 2, 3, 1, 4, 8)
    with pytest.raises(AmbiguousLayoutError, match="kind="):
        plan(one_head, tp_size=2, page_size=4)
    assert plan(one_head, page_size=4).num_kv_heads == 1  # one rank: both readings register the same
    with pytest.raises(ValueError, match="one"):
        plan(views("LBNHC", 2, 3, 2, 4, 8), kind="mla", page_size=4)


def test_views_that_are_not_one_vllm_layout_are_refused():
    raw = torch.zeros(4096, dtype=torch.bfloat16)
    page = 4 * 2 * 8  # tokens x heads x C, padded to page + 8 elements per block
    padded = {f"l.{i}": raw.as_strided((3, 2, 4, 8), (page + 8, 8, 16, 1), i * 3 * (page + 8)) for i in range(2)}
    with pytest.raises(NotAddressableError, match="padd"):
        plan(padded, page_size=4)
    uneven = {f"l.{i}": raw.as_strided((3, 2, 4, 8), (page, 8, 16, 1), off) for i, off in enumerate((0, 200, 1000))}
    with pytest.raises(NotAddressableError, match="evenly"):
        plan(uneven, page_size=4)


def test_legacy_five_dim_and_separate_tensors_do_not_take_the_vllm_033_path():
    legacy = {f"l.{i}": torch.zeros(2, 3, 4, 2, 8) for i in range(2)}
    assert not is_vllm_dict(legacy)
    separate = {f"l.{i}": torch.zeros(3, 2, 4, 8) for i in range(2)}
    assert not is_vllm_dict(separate)
    sliced = torch.zeros(2, 2, 6, 1, 8)  # [L, KV, rows, heads, dim], one layer per entry
    kv = {f"l.{i}": sliced[i] for i in range(2)}
    with pytest.raises(AmbiguousLayoutError, match="axes='KV N H D'"):
        plan(kv, page_size=2)
    assert plan(kv, page_size=2, axes="KV N H D").num_layer == 2


def test_adapt_gives_an_aliasing_mla_view_for_layer_outermost_mla_and_refuses_the_rest():
    kv_caches = views("LHBNC", 3, 4, 1, 2, 8)  # 2-token kernel blocks, 4-token manager blocks
    view = adapt(kv_caches, page_size=4, kind="mla")
    assert isinstance(view, MLAView) and (view.num_blocks, view.page_size, view.layer_ids) == (2, 4, [0, 1, 2])
    layer = kv_caches["model.layers.1.attn"]
    view.kv_buffer[1][5].fill_(9)  # manager block 1, token 1 = kernel block 2, token 1
    assert torch.equal(layer[2, 0, 1].view(torch.int16), torch.full((8,), 9, dtype=layer.dtype).view(torch.int16))
    with pytest.raises(NotAddressableError, match="BLOCKFIRST"):
        adapt(views("BLNHC", 3, 4, 1, 2, 8), page_size=2, kind="mla")
    with pytest.raises(NotAddressableError, match=r"\[K \| V\]"):
        adapt(views("LBNHC", 3, 4, 2, 2, 8), page_size=2)


@pytest.mark.parametrize("option", [{"start_layer": 7}, {"dtype": torch.int16}, {"layer_num": 3}, {"head_dim": 8}])
def test_adapt_refuses_options_a_vllm_dict_would_not_apply(option):
    # Its geometry comes from strides: an option that is silently not applied would mislabel the view.
    with pytest.raises(AdapterError, match=r"do not apply to a vLLM 0.33 dict"):
        adapt(views("LHBNC", 3, 4, 1, 2, 8), page_size=4, kind="mla", **option)


# --- hostile inputs: each once crashed raw or dropped data silently ---------------------


def test_keys_that_are_not_layer_names_are_refused_not_merged_or_crashed():
    kv = list(views("LBNHC", 2, 3, 2, 4, 8).values())
    for bad in ({1: kv[0], "1": kv[1]}, {0: kv[0], 1: kv[1]}, {(0,): kv[0], (1,): kv[1]}):
        with pytest.raises(InconsistentLayersError, match="layer names"):
            plan(bad, page_size=4, kind="mha")
    mla = list(views("LBNHC", 2, 3, 1, 4, 8).values())
    with pytest.raises(InconsistentLayersError, match="layer names"):
        adapt({0: mla[0], 1: mla[1]}, page_size=4, kind="mla")


def test_indexer_entries_are_not_dropped_silently():
    kv = views("LBNHC", 2, 3, 1, 4, 8)
    kv["model.layers.0.attn.k_cache"] = torch.zeros(3, 4, 16, dtype=torch.uint8)
    with pytest.raises(NotAddressableError, match=r"k_cache.*plugin"):
        plan(kv, page_size=4, kind="mla")
    with pytest.raises(NotAddressableError, match=r"k_cache.*plugin"):
        adapt(kv, page_size=4, kind="mla")


@pytest.mark.parametrize("axis", range(4))
def test_empty_caches_are_refused(axis):
    extents = [2, 3, 2, 4, 8]
    extents[[1, 2, 3, 4][axis]] = 0
    kv = views("LBNHC", *extents)
    with pytest.raises(AdapterError, match="empty"):
        plan(kv, page_size=4, kind="mha")
    with pytest.raises(AdapterError, match="empty"):
        plan({f"l.{i}": torch.empty(0, 2, 4, 8) for i in range(2)}, page_size=4, kind="mha")


@pytest.mark.parametrize("page_size", ["4", 4.0, 0, -4, True])
def test_a_page_size_that_is_not_a_positive_int_is_an_adapter_error(page_size):
    for kind in ("mha", "mla"):
        kv = views("LBNHC", 2, 4, 2 if kind == "mha" else 1, 2, 8)
        with pytest.raises(AdapterError, match="page_size"):
            plan(kv, page_size=page_size, kind=kind)
    with pytest.raises(AdapterError, match="page_size"):
        adapt(views("LBNHC", 2, 4, 1, 2, 8), page_size=page_size, kind="mla")


@pytest.mark.parametrize("kind", ["MHA", "bogus", 3])
def test_an_unknown_kind_is_refused(kind):
    with pytest.raises(AdapterError, match="kind"):
        plan(views("LBNHC", 2, 3, 2, 4, 8), page_size=4, kind=kind)


@pytest.mark.parametrize("page", [None, 4])
def test_per_layer_paged_tensors_from_one_buffer_are_not_taken_for_one_token_vllm_blocks(page):
    """[P, T, 1, D] per-layer pages carved from one buffer have exactly the strides of vLLM [B, H=T, N=1, C].

    Read as vLLM with page_size=T, T one-token "kernel blocks" were glued into one block and FlexKV read
    pages 4..7 for page 1; without page_size it registered T heads of one token. Two readings: refuse.
    """
    buf = distinct((2, 8, 4, 1, 8), torch.bfloat16)  # [L, P, T, H, D]
    kv = {f"model.layers.{i}.attn": buf[i] for i in range(2)}
    with pytest.raises(AmbiguousLayoutError, match="axes='P T H D'"):
        plan(kv, page_size=page)
    p = plan(kv, page_size=4, axes="P T H D", kind="mla")  # the option that settles it
    want = bytes(buf[0, 1].contiguous().view(torch.uint8).flatten().tolist())
    assert flexkv_worker_read(p.layout_fields(), list(p.tensors), 0, 0, 1) == want
    vllm = plan_vllm(views("LBHNC", 2, 8, 4, 1, 8), kind="mha", block_size=1)  # vLLM itself: plan_vllm
    assert (vllm.num_head, vllm.tokens_per_block) == (4, 1)


@st.composite
def strided_dicts(draw):
    """Per-layer [B, H, N, C] views over one buffer: vLLM's six layouts (mostly clean) and, for one draw in
    three, any axis order, padding, layer step, base offset, dict order and aliases."""
    dtype = draw(st.sampled_from([torch.int8, torch.bfloat16, torch.float32, torch.float64]))
    extents = [draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 3))]  # L, B, H
    extents += [draw(st.sampled_from([4, 1, 2])), draw(st.sampled_from([16, 8, 4, 2, 1]))]  # N, C
    bent = draw(st.integers(0, 2)) == 0
    layouts = st.sampled_from(list(LAYOUTS.values()))
    order = draw(st.one_of(layouts, st.permutations(range(5))) if bent else layouts)
    odd = st.sampled_from([0, 0, 0, 1, 2, 8]) if bent else st.just(0)
    strides, inner = {}, 1
    for axis in reversed(order):
        strides[axis] = inner
        inner *= extents[axis] + draw(odd)  # padding after the axis
    step = max(0, strides[0] + draw(st.sampled_from([0, -1, 1, 8]) if bent else st.just(0)))  # overlap, gap
    base = draw(odd) * draw(st.sampled_from([1, 2]))
    size = base + step * (extents[0] - 1) + sum((extents[a] - 1) * strides[a] for a in range(1, 5)) + 1
    buf = torch.randint(-128, 127, (size * dtype.itemsize,), dtype=torch.int8).view(dtype)
    slots = list(range(extents[0]))
    slots = draw(st.permutations(slots)) if bent else slots
    shape, stride = tuple(extents[1:]), tuple(strides[a] for a in range(1, 5))
    kv = {f"model.layers.{i}.attn": buf.as_strided(shape, stride, base + s * step) for i, s in enumerate(slots)}
    if extents[0] > 1 and draw(st.booleans()):
        kv[f"model.layers.{extents[0]}.attn"] = kv["model.layers.0.attn"]  # a KV-sharing layer
    ratio = draw(st.sampled_from([1, 2, 3])) if order[0] == 0 or bent else 1  # kernel blocks: LB* layouts
    return kv, extents[3] * ratio, draw(st.sampled_from([None, "mha", "mla"]))


@settings(max_examples=150, deadline=None)
@given(strided_dicts(), st.sampled_from([1, 1, 2]))
def test_any_strided_views_are_read_byte_for_byte_or_refused(case, tp):
    kv, block_size, kind = case
    try:
        p = plan_vllm(kv, kind=kind, block_size=block_size, tp_size=tp)
    except AdapterError as exc:
        event(type(exc).__name__)
        return
    event(f"{p.type.value}, {p.num_layer} layers, {p.num_block} blocks")
    for layer, view in enumerate(kv.values()):
        ratio = block_size // view.shape[2]
        for block in range(p.num_block):
            part = view[block * ratio : (block + 1) * ratio].permute(0, 2, 1, 3).reshape(-1)
            want = bytes(torch.empty(part.shape, dtype=part.dtype).copy_(part).view(torch.uint8).tolist())
            assert flexkv_worker_read(p.layout_fields(), list(p.tensors), layer, 0, block) == want, (layer, block)


@pytest.mark.parametrize("option", [{"head_num": 4}, {"layer_ids": [5, 6]}, {"dtype": torch.float32}, {"hed_num": 2}])
def test_plan_options_a_vllm_dict_cannot_honour_are_refused_not_ignored(option):
    with pytest.raises(AdapterError, match=next(iter(option))):
        plan(views("LBNHC", 2, 3, 2, 4, 8), page_size=4, kind="mha", **option)


@pytest.mark.parametrize("kv", [{}, {"model.layers.0.attn.k_cache": torch.zeros(3, 4, 16)}])
def test_a_dict_without_main_kv_is_refused(kv):
    with pytest.raises(NotAddressableError, match="no KV cache"):
        plan_vllm(kv)


def test_separate_k_and_v_entries_of_one_buffer_are_not_read_as_layers():
    # [P, T=1, H, D] K and V entries share vLLM [B, 1, N, C] strides; read as 2L MLA layers of H-token
    # blocks, FlexKV would store K and V as separate layers with the wrong block size.
    buf = torch.arange(2 * 2 * 6 * 1 * 4 * 8, dtype=torch.int16).view(2, 2, 6, 1, 4, 8)
    kv = {f"model.layers.{i}.attn.{n}": buf[i, j] for i in range(2) for j, n in enumerate("kv")}
    for options in ({}, {"kind": "mha"}, {"kind": "mla", "page_size": 4}):
        with pytest.raises(InconsistentLayersError, match=r"repeat layer index \[0, 1\]"):
            plan(kv, **options)


def test_a_key_whose_str_raises_is_an_adapter_error():
    class Key:
        def __str__(self):
            raise RuntimeError("no name")

        __repr__ = object.__repr__

    kv = list(views("LBNHC", 2, 3, 1, 4, 8).values())
    with pytest.raises(AdapterError):
        adapt({Key(): kv[0], Key(): kv[1]}, page_size=4, kind="mla")
    with pytest.raises(AdapterError):
        plan({Key(): kv[0], Key(): kv[1]}, page_size=4, kind="mla")


def test_plan_of_a_vllm_dict_checks_kind_as_adapt_does():
    import numpy as np

    kv = views("LBNHC", 2, 4, 1, 16, 24)
    for odd in (np.array(["mla", "mha"]), np.array("mla"), 3):
        with pytest.raises(AdapterError, match="kind must be one of"):
            plan(kv, kind=odd)
    assert plan(kv, kind="mla").kind == "mla"
