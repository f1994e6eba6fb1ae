"""Hypothesis strategies for pools with planes beside their KV, varied where the gate has rules.

Each draw is a quantised (scale planes), DSA-like (indexer) or MiniMax-like (index KV) pool whose planes vary
where the gate has rules: how many tensors a plane has for the KV's layers, which device and storage they
live on (meta, released, 0-d, 0 rows), whether they alias the KV or each other (shifted by a block, by half
a row, or not at all), the indexer's metadata values (bounded integers, flags of every kind) and the
length of MiniMax's layer mapping against the index pool's layers.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

PAGE, PAGES = 16, 4


ROWS = PAGE * PAGES
KV_ROW = 2 * 8  # bytes of one MHA row: 2 heads x 8 uint8


def _uint8(rows: int, cols: int) -> torch.Tensor:
    return torch.zeros(rows, cols, dtype=torch.uint8)


def _spoil(draw: st.DrawFn, planes: list[torch.Tensor], kv: list[torch.Tensor]) -> tuple[list[torch.Tensor], str]:
    """The plane tensors as drawn: fine, or with one of the defects the gate refuses."""
    how = draw(st.sampled_from(["fine", "fine", "meta", "released", "0-d", "0-row", "kv-shift", "half-row", "twice"]))
    if how == "fine" or not planes:
        return planes, "fine"
    i = draw(st.integers(0, len(planes) - 1))
    t = planes[i]
    if how == "meta":
        planes[i] = torch.zeros(t.shape, dtype=t.dtype, device="meta")
    elif how == "released":
        t.untyped_storage().resize_(0)
    elif how == "0-d":
        planes[i] = torch.tensor(1, dtype=t.dtype)
    elif how == "0-row":
        planes[i] = t[:0]
    elif how in ("kv-shift", "half-row"):  # the plane's bytes inside the KV's, a block or half a row in
        flat = kv[draw(st.integers(0, len(kv) - 1))].view(torch.uint8).view(-1)
        shift = PAGE * kv[0][0].numel() * kv[0].element_size() if how == "kv-shift" else KV_ROW // 2
        need = t.numel() * t.element_size()
        if shift + need > flat.numel():
            return planes, "fine"
        planes[i] = flat[shift : shift + need].view(t.dtype).view(t.shape)
    else:  # one plane tensor registered for two layers
        planes[(i + 1) % len(planes)] = t
        if len(planes) == 1:
            return planes, "fine"
    return planes, how


class PlaneCase:
    """A drawn pool, shown by what was drawn: a released tensor's repr reads freed memory."""

    def __init__(self, pool: Any, options: dict[str, Any], notes: dict[str, Any]) -> None:
        self.pool, self.options, self.notes = pool, options, notes

    def __repr__(self) -> str:
        return f"PlaneCase({self.notes}, options={self.options})"


def _count(draw: st.DrawFn, layers: int) -> int:
    return max(1, layers + draw(st.sampled_from([0, 0, 0, -1, 1])))


@st.composite
def plane_pools(draw: st.DrawFn) -> PlaneCase:
    """A pool with planes the gate must refuse or admit, and options to pass."""
    family = draw(st.sampled_from(["scales", "indexer", "minimax"]))
    layers = draw(st.integers(1, 3))
    notes: dict[str, Any] = {"family": family, "layers": layers}
    if family == "minimax":
        main_ids = list(range(layers + 1))
        mapped = sorted(draw(st.sets(st.sampled_from([*main_ids, 9]), min_size=1, max_size=len(main_ids))))
        index_layers = _count(draw, len(mapped))
        k = [torch.zeros(ROWS, 1, 8, dtype=torch.bfloat16) for _ in range(index_layers)]
        v = [torch.zeros(ROWS, 1, 8, dtype=torch.bfloat16) for _ in range(index_layers)]
        main_k = [torch.zeros(ROWS, 2, 8, dtype=torch.bfloat16) for _ in main_ids]
        k, how = _spoil(draw, k, main_k)
        main = SimpleNamespace(
            k_buffer=main_k,
            v_buffer=[torch.zeros(ROWS, 2, 8, dtype=torch.bfloat16) for _ in main_ids],
            page_size=PAGE,
            model_layer_ids=main_ids,
        )
        index = SimpleNamespace(k_buffer=k, v_buffer=v, page_size=PAGE)
        pool: Any = SimpleNamespace(
            main_pool=main, index_kv_pool=index, index_kv_layer_id_mapping={g: i for i, g in enumerate(mapped)}
        )
        notes.update(mapped=mapped, index_layers=index_layers, spoiled=how)
    else:
        kind = draw(st.sampled_from(["mha", "mla"]))
        kv = [torch.zeros(ROWS, 2, 8, dtype=torch.uint8) for _ in range(layers)]
        pool = (
            SimpleNamespace(k_buffer=kv, v_buffer=[torch.zeros_like(t) for t in kv], page_size=PAGE)
            if kind == "mha"
            else SimpleNamespace(kv_buffer=[t.view(ROWS, 1, 16) for t in kv], page_size=PAGE)
        )
        notes["kind"] = kind
        if family == "scales":
            names = draw(st.sampled_from([("k_scale_buffer", "v_scale_buffer"), ("kv_scale_buffer",)]))
            per_page = draw(st.booleans())
            for name in names:
                tensors = [
                    _uint8(PAGES, PAGE * 2) if per_page else _uint8(ROWS, 2) for _ in range(_count(draw, layers))
                ]
                tensors, how = _spoil(draw, tensors, kv)
                setattr(pool, name, tensors)
            notes.update(names=names, spoiled=how)
        else:
            rows = [_uint8(PAGES, PAGE * 8) for _ in range(layers)]
            rows, how = _spoil(draw, rows, kv)
            pool.index_k_with_scale_buffer = rows
            kpool = draw(st.sampled_from([None, 1, 2, 0, -1, 128, True, np.int64(2), "2", 1.0]))
            if kpool is not None:
                pool.index_kpool = kpool
            for flag in ("kpool_use_compress", "index_kpool_compress"):
                value = draw(st.sampled_from([None, False, np.bool_(False), torch.tensor(False), np.array([False]), 0]))
                if value is not None:
                    setattr(pool, flag, value)
            notes.update(spoiled=how, kpool=kpool)
    options: dict[str, Any] = {}
    if (mode := draw(st.sampled_from([None, None, "error", "attention_only"]))) is not None:
        options["hybrid"] = mode
    return PlaneCase(pool, options, notes)
