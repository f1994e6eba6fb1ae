"""``adapt()`` of a vLLM 0.33 cache dict: MLA rows as an :class:`MLAView` where layers are contiguous.

The geometry and the FlexKV form come from :mod:`~flexkv_adapter.vllm_layout`; this module only
turns a LAYERFIRST MLA form into per-layer ``kv_buffer`` rows, or refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .carve import check_flexkv_alignment
from .errors import NotAddressableError
from .labels import names_layer_ids
from .layout import ViewKind
from .report import Report
from .views import MLAView
from .vllm_layout import ONE_HEAD_FIX, read_geometry, resolve_kind, vllm_form


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
    buffers = [c.view(c.shape[0] * c.shape[1], 1, c.shape[3]) for c in form.chunks]
    check_flexkv_alignment({"kv": buffers}, form.tokens_per_block, kv_caches, ("vLLM kv_caches",))  # as plan()
    layer_ids = names_layer_ids(g.names, layer_ids, where)
    rows, first = buffers[0].shape[0], buffers[0]
    report = Report(
        source_kind="vLLM 0.33 kv_caches",
        recognizer="vllm-0.33",
        attributes=g.names,
        reading=f"MLA per-layer [B H N C] ({'/'.join(g.layouts)})",
        kind="mla",
        layer_ids=tuple(layer_ids),
        excluded_layers=(),
        page_size=form.tokens_per_block,
        rows=rows,
        aligned_rows=rows,
        num_blocks=form.num_block,
        dtype=str(first.dtype).removeprefix("torch."),
        device=str(first.device),
        bytes_aliased=sum(b.numel() * b.element_size() for b in buffers),
        bytes_copied=0,
        notes=(form.note,),
    )
    return MLAView(
        buffers,
        source=kv_caches,
        layer_ids=layer_ids,
        page_size=form.tokens_per_block,
        num_blocks=form.num_block,
        dtype=first.dtype,
        device=first.device,
        report=report,
    )
