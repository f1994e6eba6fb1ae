"""vLLM 0.33 cache dicts as :func:`allocate_kv_cache` lays them out, for the common-pipeline property,
and vLLM dicts as :class:`~tests.strategies.cases.Case` s.

One int8 buffer per allocation, a stride permutation of ``[L, B, H, N, C]`` (``LAYOUTS``), one
``[B, H, N, C]`` view per layer; MHA (H > 1) or MLA (H = 1); kernel blocks split a manager block
(``ratio``); KV sharing (a later layer's name maps to its target's tensor object); several cache
groups (HMA: a second group's layers are distinct views of the same bytes); dicts out of layer order;
and a mapping whose ``[]`` hands out copies of what its ``items()`` shows. As cases: dicts where a later
layer reuses an earlier slot (the same object: KV sharing; a distinct view: HMA, refused), and dicts where
some names hold no layer index (``mtp.attn``), with ``layer_ids=`` right, wrong or absent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from flexkv_adapter.readers.vllm_layout import LAYOUTS

from ..helpers import distinct
from .cases import DTYPE, Case, aligned_regions


class CopyingMapping(Mapping[str, torch.Tensor]):
    """``items()`` shows the views; ``[]`` returns a copy of each (a getter that copies)."""

    def __init__(self, data: dict[str, torch.Tensor]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._data[key].clone()

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> Any:
        return self._data.items()


def layer_views(layout: str, layers: int, blocks: int, heads: int, tokens: int, content: int) -> list[torch.Tensor]:
    order = LAYOUTS[layout]
    extents = (layers, blocks, heads, tokens, content)
    raw = torch.randint(0, 256, (layers * blocks * heads * tokens * content * 2,), dtype=torch.uint8)
    physical = raw.view(torch.bfloat16).view(*(extents[a] for a in order))
    logical = physical.permute(*(order.index(a) for a in range(5)))
    return [logical[i] for i in range(layers)]


VARIANTS = ("plain", "shuffled", "kv-sharing", "groups", "copying")


@st.composite
def vllm_033_dicts(draw: st.DrawFn, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """A dict (or hostile mapping) and what it is: layout, heads, tokens, ratio, and its variant (of ``variants``)."""
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    layers, heads = draw(st.integers(1, 3)), draw(st.sampled_from([1, 1, 2]))
    tokens, content = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4, 8, 12]))
    ratio = 1 if layout.startswith("B") else draw(st.sampled_from([1, 2]))  # vLLM splits layer-outermost only
    blocks = ratio * draw(st.sampled_from([1, 3, 4] if ratio == 1 else [3, 4]))  # 2 blocks also read as K/V
    if tokens == 1 and heads > 1:
        tokens = 2  # [B, H, 1, C] reads as per-layer pages too (the other ambiguity)
    views = layer_views(layout, layers, blocks, heads, tokens, content)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    variant = draw(st.sampled_from(variants))
    entries = list(zip(names, views))
    if variant == "shuffled":
        entries = draw(st.permutations(entries))
    elif variant == "kv-sharing":  # a later layer reads its target's KV: the same tensor object
        entries.append((f"model.layers.{layers}.self_attn.attn", views[draw(st.integers(0, layers - 1))]))
    elif variant == "groups":  # a second cache group's layers: distinct views over the same bytes
        entries += [(f"model.layers.{layers + i}.self_attn.attn", v.view(v.shape)) for i, v in enumerate(views)]
    data = dict(entries)
    kv = CopyingMapping(data) if variant == "copying" else data
    return dict(kv=kv, layout=layout, heads=heads, tokens=tokens, ratio=ratio, variant=variant)


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


@st.composite
def aliased_storage_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    """vLLM 0.33 dicts whose layers view two storages over one allocation, the second's start shifted by any
    number of pages (``torch.from_numpy`` of two slices of one array): each entry's strides and storage
    offset are those of a valid allocation, yet an entry of one storage may start inside a layer of the
    other (one storage cannot do this: its layer slots are disjoint) or cover another entry's bytes. Each
    element holds its own index in the allocation, so an entry's values say which elements it views."""
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    layers, blocks, heads = draw(st.integers(2, 3)), draw(st.sampled_from([1, 3, 4])), draw(st.sampled_from([1, 2]))
    tokens, content = draw(st.sampled_from([2, 4])), draw(st.sampled_from([4, 8]))
    order, extents = LAYOUTS[layout], (layers, blocks, heads, tokens, content)
    page = heads * tokens * content
    total = layers * blocks * page
    shift = draw(st.integers(-layers * blocks, layers * blocks)) * page  # whole pages: FlexKV's alignment holds
    raw = np.arange(3 * total, dtype=np.int64)  # each element's value: its index in the allocation
    starts = [total, total + shift]  # storage a, storage b
    which = draw(st.lists(st.integers(0, 1), min_size=layers - 1, max_size=layers - 1))
    which.append(1 - which[0] if len(set(which)) == 1 else draw(st.integers(0, 1)))  # both storages
    per_layer = []
    for i, start in enumerate(starts[w] for w in which):
        physical = torch.from_numpy(raw[start : start + total]).view(*(extents[a] for a in order))
        per_layer.append(physical.permute(*(order.index(a) for a in range(5)))[i])
    return {f"model.layers.{i}.attn": v for i, v in enumerate(per_layer)}
