"""``adapt()`` of a vLLM 0.33 cache dict: MLA rows as an :class:`MLAView` where layers are contiguous.

The geometry and the FlexKV form come from :mod:`~flexkv_adapter.readers.vllm_layout` (which layouts read
as per-layer MLA rows, and the manager block); the view itself comes from the common builder
(:func:`~flexkv_adapter.pipeline.build.build_view`), so every rule there (alignment, zero-copy proof, labels,
overlaps) applies to vLLM dicts as to every other source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from ..errors import NotAddressableError, UnsupportedPoolError
from ..model.axes import parse_axes
from ..model.layout import Geometry, Interpretation, ViewKind
from ..model.views import MLAView
from ..readers.containers import Located
from ..readers.recognize import locate
from ..readers.vllm_layout import ONE_HEAD_FIX, read_geometry, resolve_kind, vllm_form
from .build import build_view
from .carve import logical_views


def adapt_vllm(
    kv_caches: Mapping[str, torch.Tensor],
    page_size: int | None,
    kind: ViewKind | None,
    layer_ids: Sequence[int] | None = None,
) -> MLAView:
    """:func:`~flexkv_adapter.adapt` of a vLLM 0.33 dict: MLA rows as an :class:`MLAView`, or a refusal.

    MHA cells are packed ``[K | V]``: no zero-copy ``k_buffer``/``v_buffer`` exists, so MHA goes
    through :func:`~flexkv_adapter.flexkv.plan` (one packed tensor per layer) instead.
    """
    g = read_geometry(kv_caches)
    where = f"vLLM KV cache ({'/'.join(g.layouts)})"
    if resolve_kind(kind, g.heads, None, where) == "mha":
        raise NotAddressableError(
            f"{where}: vLLM 0.33 MHA cells are packed [K | V] per (block, head, token); adapt() exposes separate "
            f"k_buffer/v_buffer, which cannot alias them. Register the dict with flexkv_adapter.plan(kv_caches, "
            f"kind='mha', page_size=<vLLM block_size>, tp_size=<TP>) (one packed tensor per layer, kv_dim=1) or "
            f"through the flexkv_adapter vLLM plugin"
        )
    form = vllm_form(kv_caches, kind="mla", block_size=page_size)
    if form.type != "LAYERFIRST":
        raise NotAddressableError(
            f"{where}: each block interleaves all layers, so there is no per-layer kv_buffer. Register the dict "
            f"with flexkv_adapter.plan(kv_caches, kind='mla', page_size=...) (one BLOCKFIRST tensor), or "
            f"{ONE_HEAD_FIX}"
        )
    located = _located(kv_caches)
    interp = Interpretation("mla", parse_axes("P H T D"), per_layer=True)  # each [B, H=1, N, C] view, as written
    given = {"kind", "page_size", *(("layer_ids",) if layer_ids is not None else ())}
    ids = tuple(layer_ids) if layer_ids is not None else None
    geometry = Geometry(page_size=form.tokens_per_block, kind="mla", layer_ids=ids, given=frozenset(given))
    view = build_view(kv_caches, located, interp, logical_views(located, interp), geometry)  # the common rules
    report = replace(
        view.report,
        source_kind="vLLM 0.33 kv_caches",
        recognizer="vllm-0.33",
        attributes=g.names,
        reading=f"MLA per-layer [B H N C] ({'/'.join(g.layouts)})",
        notes=(*view.report.notes, form.note),
    )
    return view.rebuild(report=report)  # type: ignore[return-value]


def _located(kv_caches: Mapping[str, torch.Tensor]) -> Located:
    """The dict read as every dict is (one container, names to layer ids, read twice), its layers kept in
    the dict's order: vLLM's own order, which the view has always had."""
    found, declined = locate(kv_caches)
    if not found:
        raise UnsupportedPoolError(f"vLLM KV caches: {'; '.join(declined)}")
    c = found[0].containers[0]
    if c.dict_order is None:
        return found[0]
    back = sorted(range(len(c.tensors)), key=lambda j: c.dict_order[j])  # type: ignore[index]
    ordered = replace(
        c,
        tensors=tuple(c.tensors[j] for j in back),
        layer_ids=None if c.layer_ids is None else tuple(c.layer_ids[j] for j in back),
        dict_order=tuple(range(len(back))),
        names=None if c.names is None else tuple(c.names[j] for j in back),
    )
    return replace(found[0], containers=(ordered,))
