"""vLLM 0.33 KV caches: recover the backing geometry of its per-layer views, pick a form FlexKV reads.

vLLM 0.33 (``vllm/v1/worker/utils.py`` ``allocate_kv_cache``) puts every layer of a cache group in
one int8 buffer laid out as a stride permutation of ``[L, B, H, N, C]`` (``KVCacheLayout``: LBHNC,
LBNHC, LHBNC, BLHNC, BLNHC, BHLNC) and hands each layer a ``[B, H, N, C]`` view. MHA cells are
``[K | V]`` (C = head_size + head_size_v), MLA has H = 1 and C = the latent row. Views of a block
may be kernel blocks, smaller than the manager block FlexKV's block ids count.

The shape is the same in all six layouts, so the layout is read from strides and storage offsets.
FlexKV ignores strides, so each layout gets one of two forms whose bytes FlexKV's address arithmetic
lands on exactly, or a refusal naming the ``VLLM_KV_CACHE_LAYOUT`` (or attention backend) that works:

- ``LAYERFIRST``: one ``[blocks, H, tokens, C]`` token-major tensor per layer, ``kv_dim=1`` (where a
  layer's manager blocks are contiguous: LBNHC; LBHNC/LHBNC with one head);
- ``BLOCKFIRST``: one tensor ``[blocks, L, 1, tokens*H*C]`` over the whole buffer (BLNHC; BLHNC/BHLNC
  with one head), when kernel and manager blocks are the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from math import prod
from typing import Any, cast

import torch

from ..config.integers import LIMIT, bounded_integer
from ..errors import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    NotAddressableError,
    UnsupportedPoolError,
    describe,
)
from ..model.copy_rules import storage_problem
from ..model.layout import ViewKind
from ..text import short_repr
from .containers import SELF, Container, copy_problem, layer_index_from_name, make_container, read_again
from .vllm_detect import INDEXER_SUFFIX, is_vllm_dict, layer_items, vllm_twin

#: vLLM 0.33 ``KVCacheLayout`` values: the physical order of the logical axes [L, B, H, N, C].
LAYOUTS: dict[str, tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}
_L, _B, _H, _N, _C = range(5)
_MHA_FIX = (
    "set VLLM_KV_CACHE_LAYOUT=LBNHC (token-major, layer-outermost; the default when the flexkv_adapter plugin "
    "is installed and the variable is unset). If the attention backend rejects LBNHC (FlashInfer on Blackwell "
    "supports only LBHNC and BLHNC), select one that supports it: --attention-backend FLASH_ATTN"
)
__all__ = ["INDEXER_SUFFIX", "LAYOUTS", "is_vllm_dict", "read_geometry", "vllm_form", "vllm_twin"]
ONE_HEAD_FIX = "set VLLM_KV_CACHE_LAYOUT to a layer-outermost layout (LBNHC, LBHNC or LHBNC)"


@dataclass(frozen=True)
class VLLMGeometry:
    """What the views' strides and offsets say about the backing buffer."""

    layouts: tuple[str, ...]  # every KVCacheLayout whose addresses these views have (byte-identical)
    names: tuple[str, ...]  # main entries, in dict order
    slots: tuple[int, ...]  # each entry's layer slot in the buffer (aliases share one)
    indexer: tuple[str, ...]  # entries FlexKV splits off by name
    blocks: int
    heads: int
    tokens: int
    content: int

    @property
    def num_slots(self) -> int:
        return len(set(self.slots))

    @property
    def aliases(self) -> bool:
        return len(self.slots) != self.num_slots


def _strides(layout: tuple[int, ...], extents: tuple[int, ...]) -> dict[int, int]:
    out, inner = {}, 1
    for axis in reversed(layout):
        out[axis] = inner
        inner *= extents[axis]
    return out


def read_geometry(kv_caches: Mapping[str, torch.Tensor]) -> VLLMGeometry:
    """Recover the layout from strides and storage offsets (never from shape alone)."""
    if not isinstance(kv_caches, Mapping):
        raise UnsupportedPoolError(f"vLLM KV caches must be a dict of name -> tensor, got {short_repr(kv_caches)}")
    items = layer_items(kv_caches)
    if odd := [n for n, _ in items if not isinstance(n, str)]:  # str(n) would merge 1 and "1" into one layer
        raise InconsistentLayersError(
            f"vLLM KV caches: keys {short_repr(odd, 200)} are not layer names (str keys, as vLLM's)"
        )
    names: list[str] = [n for n, _ in items]
    indexer = tuple(n for n in names if n.endswith(INDEXER_SUFFIX))
    main: dict[str, torch.Tensor] = {n: t for n, t in items if n not in indexer}
    parsed = [layer_index_from_name(n) for n in main]
    ids = [i for i in parsed if i is not None]
    if len(ids) == len(parsed) and len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})[:3]
        raise InconsistentLayersError(
            f"vLLM KV caches: names {list(main)[:4]} repeat layer index {repeated} (separate K and V entries?); "
            f"vLLM 0.33 gives one [B, H, N, C] entry per layer. Read per-layer K/V tensors with axes= instead"
        )
    for name, t in main.items():  # what vLLM 0.33 gives: one 4-D view with memory per layer
        what = f"{type(t).__name__}" if not isinstance(t, torch.Tensor) else f"{t.ndim}-D ({describe(t)})"
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise UnsupportedPoolError(
                f"vLLM KV caches: {name} is {what}; vLLM 0.33 gives one 4-D [B, H, N, C] tensor per layer. "
                f"Read other tensors with adapt(..., axes=...)"
            )
        if why := storage_problem(t):
            raise UnsupportedPoolError(f"vLLM KV caches: {name} {why}")
    first_name, first = next(iter(main.items()), ("", torch.empty(0)))
    if 0 in first.shape:  # no entry besides indexer ones, or empty tensors
        raise NotAddressableError(f"vLLM KV caches: no KV cache in {names[:3]} ({describe(first)}): empty")
    for name, t in main.items():
        if (t.shape, t.stride(), t.dtype, t.device) != (first.shape, first.stride(), first.dtype, first.device):
            raise InconsistentLayersError(
                f"vLLM KV caches: {name} ({describe(t)}) differs from {first_name} ({describe(first)}); "
                f"one cache group's layers share shape, strides and dtype (several groups (HMA) are not supported)"
            )
    offsets = [int(t.storage_offset()) for t in main.values()]
    distinct = sorted(set(offsets))
    step = distinct[1] - distinct[0] if len(distinct) > 1 else 0
    if any(b - a != step for a, b in pairwise(distinct)):
        raise NotAddressableError(
            f"vLLM KV caches: layer offsets {distinct[:6]}... are not evenly spaced; this is not one vLLM 0.33 "
            f"cache-group allocation (VLLM_KV_CACHE_LAYOUT layouts space layers evenly)"
        )
    blocks, heads, tokens, content = (int(x) for x in first.shape)
    extents = (len(distinct), blocks, heads, tokens, content)
    observed = {a: int(s) for a, s in zip((_B, _H, _N, _C), first.stride())}
    observed[_L] = step
    layouts = tuple(
        name
        for name, order in LAYOUTS.items()
        if all(observed[a] == s for a, s in _strides(order, extents).items() if extents[a] > 1)
    )
    if not layouts:
        raise NotAddressableError(
            f"vLLM KV caches: {first_name} ({describe(first)}, {len(distinct)} layers {step} elements apart) "
            f"matches none of vLLM 0.33's KV cache layouts {list(LAYOUTS)}; padded or quantized pages "
            f"(page_size_padded, state_content_bytes, num_head_slots) cannot be registered: FlexKV layouts "
            f"have no block padding"
        )
    slots = tuple(distinct.index(o) for o in offsets)
    _check_sharing(main)
    return VLLMGeometry(layouts, tuple(main), slots, indexer, blocks, heads, tokens, content)


def _check_sharing(main: Mapping[str, torch.Tensor]) -> None:
    """Entries over the same bytes must be one tensor object: vLLM's KV sharing
    (``initialize_kv_cache_for_kv_sharing``) passes the target's tensor; HMA cache groups give each
    layer its own view, and FlexKV would address them all with the first group's block ids."""
    owner: dict[int, tuple[str, torch.Tensor]] = {}
    for name, t in main.items():  # by address: entries in separate storages may share an offset, not bytes
        first_name, first = owner.setdefault(t.data_ptr(), (name, t))
        if first is not t:
            raise InconsistentLayersError(
                f"vLLM KV caches: {first_name} and {name} are distinct views of the same bytes: several KV "
                f"cache groups (HMA) share one buffer, and FlexKV would read every layer with one group's block "
                f"ids. KV sharing passes the same tensor object under both names. Register one KV cache group, "
                f"or run vLLM with --disable-hybrid-kv-cache-manager"
            )


@dataclass(frozen=True)
class VLLMForm:
    """A form FlexKV addresses right: its layout fields, tensors, and the source's chunks to check."""

    type: str  # FlexKV KVCacheLayoutType name
    mode: str  # FlexKV addressing mode (by tensor count)
    kind: ViewKind
    num_layer: int
    num_block: int
    tokens_per_block: int
    num_head: int
    head_size: int
    tensors: tuple[torch.Tensor, ...]
    chunks: tuple[torch.Tensor, ...]  # per entry: [blocks, tokens, H, C] views of the source
    geometry: VLLMGeometry
    note: str


def resolve_kind(kind: ViewKind | None, heads: int, tp_size: int | None, where: str) -> ViewKind:
    """MHA or MLA; one head per rank reads like MLA, which matters unless tp_size is known to be 1."""
    if kind not in (None, "mha", "mla"):
        raise AdapterError(f"{where}: kind must be 'mha' or 'mla', got {short_repr(kind)}")
    if kind == "mla" and heads != 1:
        raise InconsistentLayersError(f"{where}: kind='mla' but the views have {heads} heads (MLA has one)")
    if kind is not None:
        return kind
    if heads > 1:
        return "mha"
    if tp_size != 1:
        raise AmbiguousLayoutError(
            f"{where}: [B, 1, N, C] views at tp_size={tp_size} are either MLA (KV shared by all ranks: "
            f"num_kv_heads=1) or MHA with one KV head per rank (num_kv_heads=tp_size); registering the wrong "
            f"one corrupts KV. Pass kind='mla' or kind='mha' (vLLM's KV cache spec type settles it: "
            f"MLAAttentionSpec is MLA)"
        )
    return "mla"  # one rank, one head: both readings register the same bytes with num_kv_heads=1


def _checked_read(kv_caches: Mapping[str, torch.Tensor], where: str) -> Mapping[str, torch.Tensor]:
    """The dict read by key, proven the memory its items() showed (the geometry's read): the read-twice rule
    of :func:`~flexkv_adapter.readers.recognize.locate`, so plan() never registers what a copying ``[]`` hands out."""
    again = read_again(kv_caches)
    first = make_container(SELF, kv_caches)
    if isinstance(first, Container) and (why := copy_problem(first, kv_caches, again)):
        raise NotAddressableError(f"{where}: {type(kv_caches).__name__}: {why}")
    if not isinstance(again, Mapping):
        raise NotAddressableError(f"{where}: {type(kv_caches).__name__}: reading its entries by key failed")
    return cast("Mapping[str, torch.Tensor]", again)  # the tensors copy_problem compared


def vllm_form(
    kv_caches: Mapping[str, torch.Tensor],
    *,
    kind: ViewKind | None = None,
    block_size: int | None = None,
    tp_size: int = 1,
    content: int | None = None,
) -> VLLMForm:
    """The FlexKV form of a vLLM 0.33 cache dict, or a refusal that names the layout that works.

    ``block_size`` is vLLM's manager block (FlexKV's tokens_per_block; the views may hold smaller
    kernel blocks), ``content`` the expected C (head_size + head_size_v for MHA, the MLA row).
    """
    g = read_geometry(kv_caches)
    where = f"vLLM KV cache ({g.layouts[0] if len(g.layouts) == 1 else '/'.join(g.layouts)})"
    if block_size is not None:
        block_size = bounded_integer(block_size, f"{where}: page_size (vLLM's block_size)", 1, LIMIT)
    if g.indexer:
        raise NotAddressableError(
            f"{where}: the dict holds DeepSeek-V3.2 indexer caches ({', '.join(g.indexer[:2])}), which this "
            f"registration does not carry: a prefix restored from FlexKV would lack their keys. Register the dict "
            f"through the flexkv_adapter vLLM plugin (FlexKV's own registration carries them), or leave them out "
            f"of the dict only if they are offloaded some other way"
        )
    kind = resolve_kind(kind, g.heads, tp_size, where)
    fix = _MHA_FIX if g.heads > 1 else ONE_HEAD_FIX
    if content is not None and content != g.content:
        raise NotAddressableError(
            f"{where}: cells hold {g.content} elements but the spec says {content} ({kind.upper()}); padded "
            f"or quantized pages cannot be registered: FlexKV layouts have no block padding"
        )
    tokens = block_size or g.tokens
    ratio = tokens // g.tokens
    if tokens < g.tokens or tokens % g.tokens or g.blocks % ratio:
        raise NotAddressableError(
            f"{where}: {g.blocks} kernel blocks of {g.tokens} tokens do not group into manager blocks of {tokens}"
        )
    read = dict(layer_items(_checked_read(kv_caches, where)))  # by plain name, as read_geometry named them
    views = [read[n] for n in g.names]
    if g.heads > 1 and g.tokens > 1 and not views[0].permute(0, 2, 1, 3)[0].is_contiguous():
        raise NotAddressableError(
            f"{where}: {describe(views[0])}: a block's [tokens, heads, C] cells are head-major or "
            f"scattered; FlexKV keeps blocks token-major, so it would copy the right bytes in the wrong order "
            f"(and split them wrongly across TP ranks). Fix: {fix}"
        )
    chunks = []
    for name, view in zip(g.names, views):
        try:
            chunks.append(view.permute(0, 2, 1, 3).view(g.blocks // ratio, tokens, g.heads, g.content))
        except RuntimeError:
            raise NotAddressableError(
                f"{where}: {name} ({describe(view)}): the {ratio} kernel blocks of {g.tokens} tokens that make "
                f"one {tokens}-token manager block are not adjacent, so FlexKV's block ids would read other "
                f"layers' bytes. Fix: {ONE_HEAD_FIX if g.heads == 1 else _MHA_FIX}"
            ) from None
    fields: dict[str, Any] = dict(
        kind=kind, num_block=g.blocks // ratio, tokens_per_block=tokens, num_head=g.heads, head_size=g.content
    )
    regrouped = f"{ratio} kernel blocks of {g.tokens} tokens per manager block; " if ratio > 1 else ""
    if all(c.is_contiguous() for c in chunks):
        tensors = tuple(c.permute(0, 2, 1, 3) for c in chunks)  # [blocks, H, tokens, C], token-major
        note = f"{regrouped}one packed [K|V] tensor per layer (LAYERFIRST, kv_dim=1)"
        if len({v.data_ptr() for v in views}) < len(views):  # one tensor under two names (vLLM's KV sharing)
            note += "; KV-sharing layers alias their target's bytes (FlexKV stores those bytes once per layer name)"
        elif len({v.untyped_storage().data_ptr() for v in views}) > 1:  # not aliases: nothing is stored twice
            note += "; the layers are in separate storages, each registered as its own tensor"
        return VLLMForm(
            "LAYERFIRST",
            "VLLM",
            num_layer=len(chunks),
            tensors=tensors,
            chunks=tuple(chunks),
            geometry=g,
            note=note,
            **fields,
        )  # type: ignore[arg-type]
    return _block_first(g, chunks, where, fix, fields)


def _block_first(g: VLLMGeometry, chunks: list[torch.Tensor], where: str, fix: str, fields: dict[str, Any]) -> VLLMForm:
    """One BLOCKFIRST tensor over every layer: FlexKV's block stride spans all layers."""
    first = chunks[0]
    chunk = prod(first.shape[1:])
    layers = g.num_slots
    why = ""
    if not first[0].is_contiguous():
        why = "a block's [tokens, heads, C] bytes are not contiguous"
    elif g.aliases or list(g.slots) != list(range(layers)):
        why = "its layers are not stored in the dict's order, one slot each (KV-sharing aliases)"
    elif first.stride(0) != layers * chunk or any(
        c.storage_offset() - first.storage_offset() != i * chunk for i, c in enumerate(chunks)
    ):
        why = "a block does not hold exactly every layer's page back to back (padding or split blocks)"
    if why:
        raise NotAddressableError(f"{where}: {describe(first)}: {why}, so FlexKV cannot address it. Fix: {fix}")
    whole = first.as_strided(
        (first.shape[0], layers, 1, chunk), (layers * chunk, chunk, chunk, 1), first.storage_offset()
    )
    return VLLMForm(
        "BLOCKFIRST",
        "TRTLLM",
        num_layer=layers,
        tensors=(whole,),
        chunks=tuple(chunks),
        geometry=g,
        note="one BLOCKFIRST tensor over all layers (kv_dim=1, packed [K|V] cells)",
        **fields,
    )  # type: ignore[arg-type]
