"""vLLM 0.33 cache dicts as :func:`allocate_kv_cache` lays them out, for the common-pipeline property.

One int8 buffer per allocation, a stride permutation of ``[L, B, H, N, C]`` (``LAYOUTS``), one
``[B, H, N, C]`` view per layer; MHA (H > 1) or MLA (H = 1); kernel blocks split a manager block
(``ratio``); KV sharing (a later layer's name maps to its target's tensor object); several cache
groups (HMA: a second group's layers are distinct views of the same bytes); dicts out of layer order;
and a mapping whose ``[]`` hands out copies of what its ``items()`` shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from flexkv_adapter.readers.vllm_layout import LAYOUTS


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


@st.composite
def vllm_033_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A dict (or hostile mapping) and what it is: layout, heads, tokens, ratio, and its variant."""
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    layers, heads = draw(st.integers(1, 3)), draw(st.sampled_from([1, 1, 2]))
    tokens, content = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4, 8, 12]))
    ratio = 1 if layout.startswith("B") else draw(st.sampled_from([1, 2]))  # vLLM splits layer-outermost only
    blocks = ratio * draw(st.sampled_from([1, 3, 4] if ratio == 1 else [3, 4]))  # 2 blocks also read as K/V
    if tokens == 1 and heads > 1:
        tokens = 2  # [B, H, 1, C] reads as per-layer pages too (the other ambiguity)
    views = layer_views(layout, layers, blocks, heads, tokens, content)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    variant = draw(st.sampled_from(["plain", "shuffled", "kv-sharing", "groups", "copying"]))
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
