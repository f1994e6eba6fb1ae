"""Every plane of a pool that shares the KV's page ids, described as one FlexKV layer group each.

A prefix hit restores the KV *and* whatever the model reads beside it at the same page: the
quantisation scales of FP4/MXFP8 pools, the DSA indexer's keys, MiniMax's index KV. FlexKV can
store several tensor groups under one set of block ids (``LayerGroupSpec``), so such a pool is
offloaded whole (:class:`WholePool`). What shares no page ids (per-request state, another index
space) cannot be, and :func:`describe` refuses it by name rather than leave it out silently.
Recognised by attributes, never class names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .errors import UnsupportedPoolError
from .hybrid_ids import id_map, inverse
from .probe import probe, probe_int

if TYPE_CHECKING:
    from .views import PoolView

# Tables SGLang derives from the planes (pointer and stride arrays for its kernels): not state.
DERIVED = frozenset({"data_ptrs", "k_data_ptrs", "v_data_ptrs", "data_strides", "kv_data_ptrs"})
# Layer ids (read as ids by hybrid_ids/labels; numpy or tensor ids are metadata there, not page-indexed state).
LAYER_METADATA = frozenset({"model_layer_ids", "mamba_layer_ids"})
# The KV planes every view already registers, and the planes described here.
PRIMARY = frozenset({"k_buffer", "v_buffer", "kv_buffer"})
SCALE_PLANES = ("k_scale_buffer", "v_scale_buffer", "kv_scale_buffer")
# What FlexKV lacks for each refused row (docs/flexkv-upstream.md).
SWA_REASON = (
    "sliding-window KV in swa_kv_pool, its own page ids through full_to_swa_index_mapping; FlexKV's standard "
    "registration has no SWA channel (only DeepSeek-V4's) and snapshots one page per node, not a window"
)
MAMBA_REASON = "linear-attention state, one row per request slot; FlexKV has no slot-addressed state channel"


class PartialPoolError(UnsupportedPoolError):
    """Part of the pool cannot be registered with the KV's page ids: FlexKV could store only the rest."""


@dataclass(frozen=True)
class Plane:
    """One layer group beside the KV: tensors indexed by the KV's page ids, block b at ``b * chunk`` bytes."""

    name: str
    tensors: tuple[torch.Tensor, ...]  # K list then V list when ``kv``; 2-D [rows, row elements], zero-copy
    layer_ids: tuple[int, ...]  # the model's layer ids (one per layer; K and V share theirs)
    num_heads: int
    head_size: int  # per token, in elements of ``dtype``
    dtype: torch.dtype
    compress_ratio: int  # page tokens per stored token (DSA kpool); 1 = one entry per token
    rows_per_block: int  # tensor rows per page: page_size for token-indexed planes, 1 for page-indexed
    kv: bool

    def chunk_bytes(self, page_size: int) -> int:
        """Bytes of one (layer, kv, page) chunk of this plane, as FlexKV's group of it copies them."""
        return page_size // self.compress_ratio * self.num_heads * self.head_size * self.dtype.itemsize


@dataclass(frozen=True)
class LeftOut:
    """Pool memory deliberately not registered, and why that loses nothing."""

    name: str
    reason: str


@dataclass(frozen=True)
class WholePool:
    """The planes of a pool FlexKV can offload whole, beside the primary KV, and what they leave out."""

    family: str
    planes: tuple[Plane, ...]
    left_out: tuple[LeftOut, ...] = ()

    def describe(self) -> str:
        planes = "; ".join(f"{p.name} ({len(p.tensors)} tensors, layers {list(p.layer_ids)})" for p in self.planes)
        left = "".join(f"; left out: {x.name} ({x.reason})" for x in self.left_out)
        return f"offloaded whole ({self.family}) as FlexKV layer groups: KV, {planes}{left}"


def _tensors(value: object) -> list[torch.Tensor] | None:
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
        return list(value)
    return None


def _flat(t: torch.Tensor, where: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise PartialPoolError(f"{where} {tuple(t.shape)} is not contiguous; FlexKV copies whole pages of it")
    return t.view(t.shape[0], -1)  # zero-copy; a 5-D plane would otherwise trip FlexKV's K/V stride probe


def _plane(name: str, lists: Sequence[list[torch.Tensor]], ids: Sequence[int], kv_rows: int, page: int) -> Plane:
    """A plane from its per-layer tensors: token-indexed (kv_rows rows) or page-indexed (kv_rows / page)."""
    first = lists[0][0]
    rows, row = first.shape[0], first[0].numel()
    if any(t.shape != first.shape or t.dtype != first.dtype for ts in lists for t in ts):
        raise PartialPoolError(f"{name}: its tensors differ in shape or dtype; one FlexKV group has one shape")
    if rows == kv_rows:  # one row per token: keep its heads when it has them
        per_block, heads = page, (first.shape[1] if first.ndim == 3 else 1)
        size = row // heads
    elif rows * page == kv_rows and row % page == 0:  # one row per page (MXFP8's interleaved scales at page 128)
        per_block, heads, size = 1, 1, row // page
    else:
        raise PartialPoolError(
            f"{name} has {rows} rows of {row} elements but the KV {kv_rows} rows: neither one row per token nor "
            f"one per page of {page} tokens, so its page ids cannot be matched to the KV's"
        )
    tensors = tuple(_flat(t, name) for ts in lists for t in ts)
    return Plane(name, tensors, tuple(ids), heads, size, first.dtype, 1, per_block, len(lists) == 2)


def _kv_rows(owner: object) -> int:
    buffers = _tensors(probe(owner, "kv_buffer")) or _tensors(probe(owner, "k_buffer"))
    if buffers is None:
        raise PartialPoolError(f"{type(owner).__name__} has scale planes but no kv_buffer or k_buffer")
    return int(buffers[0].shape[0])


def _scale_planes(pool: object, ids: Sequence[int], page: int, prefix: str = "") -> list[Plane]:
    """FP4/MXFP8 scales: without them the stored bytes cannot be dequantised."""
    k, v, kv = (_tensors(probe(pool, n)) for n in SCALE_PLANES)
    if not (k or v or kv):
        return []
    kv_rows = _kv_rows(pool)
    if k and v:
        return [_plane(f"{prefix}k_scale_buffer/v_scale_buffer", [k, v], ids, kv_rows, page)]
    if kv:
        return [_plane(f"{prefix}kv_scale_buffer", [kv], ids, kv_rows, page)]
    raise PartialPoolError(f"{type(pool).__name__} has only one of k_scale_buffer/v_scale_buffer")


def _dsa_index(pool: object, view: PoolView) -> tuple[list[Plane], list[LeftOut]]:
    """The DSA indexer: one uint8 row per page holding page_size / index_kpool tokens."""
    buffers = _tensors(probe(pool, "index_k_with_scale_buffer"))
    if buffers is None:
        return [], []
    name, page = type(pool).__name__, view.page_size
    kpool = probe_int(pool, "index_kpool") or 1
    if probe(pool, "kpool_use_compress") or (kpool > 1 and probe(pool, "index_kpool_compress")):
        raise PartialPoolError(
            f"{name} compresses its indexer with kpool={kpool}: the compress tails (_compress_tail_k/"
            f"_compress_tail_score) hold one row per request slot, not per page, and FlexKV has no slot-addressed "
            f"channel to store them with the pages (docs/flexkv-upstream.md); a restored prefix would lose them"
        )
    index_page = probe_int(pool, "index_page_size")
    size, buf_size = probe_int(pool, "size"), probe_int(pool, "index_buf_size")
    if (index_page is not None and index_page != page // kpool) or (buf_size is not None and buf_size != size):
        raise PartialPoolError(
            f"{name}: its indexer pages ({index_page} tokens, {buf_size} rows) do not follow the KV's pages "
            f"({page} / kpool {kpool}, {size} rows), as under decode context parallelism (dcp > 1); the KV's "
            f"page ids would address other index rows"
        )
    if len(buffers) != len(view.layer_ids):
        raise PartialPoolError(f"{name}: {len(buffers)} index buffers for {len(view.layer_ids)} KV layers")
    kept = [(lid, t) for lid, t in zip(view.layer_ids, buffers) if t.shape[0] > 0]
    skipped = [lid for lid, t in zip(view.layer_ids, buffers) if t.shape[0] == 0]
    left = [LeftOut(f"index_k_with_scale_buffer of layers {skipped}", "0 rows: they reuse the previous top-k")]
    left = left if skipped else []
    if not kept:
        return [], left
    tokens_per_row = page // kpool
    first = kept[0][1]
    if first.ndim != 2 or first.shape[1] % tokens_per_row:
        raise PartialPoolError(f"{name}: index rows {tuple(first.shape)} do not hold {tokens_per_row} tokens each")
    if any(t.shape != first.shape or t.dtype != first.dtype for _, t in kept) or first.shape[0] < view.num_blocks:
        raise PartialPoolError(f"{name}: index buffers differ in shape or hold fewer pages than the KV")
    plane = Plane(
        "index_k_with_scale_buffer",
        tuple(_flat(t, "index_k_with_scale_buffer") for _, t in kept),
        tuple(lid for lid, _ in kept),
        1,
        first.shape[1] // tokens_per_row,
        first.dtype,
        kpool,
        1,
        False,
    )
    return [plane], left


def _minimax(pool: object, view: PoolView) -> list[Plane]:
    """MiniMax sparse attention: index_kv (K and V) shares the main pool's token locations."""
    planes: list[Plane] = []
    if (k_only := probe(pool, "index_k_pool")) is not None:
        mapping = id_map(pool, "index_k_layer_id_mapping")
        layers = list(inverse(pool, "index_k_layer_id_mapping", mapping)) if mapping is not None else "?"
        raise PartialPoolError(
            f"{type(pool).__name__}.index_k_pool (layers {layers})"
            f" holds K without V ({type(k_only).__name__}): FlexKV's layer groups under an MHA pool copy K and V "
            f"planes per layer (kv_dim=2 from group 0), so it has no exact registration; it is not offloaded "
            f"partially either. Build the pool without disable_value_sparse_layer_ids, or serve without FlexKV"
        )
    sub = probe(pool, "index_kv_pool")
    if sub is None:
        return planes
    mapping = id_map(pool, "index_kv_layer_id_mapping")
    k, v = _tensors(probe(sub, "k_buffer")), _tensors(probe(sub, "v_buffer"))
    if not (k and v and mapping is not None) or probe_int(sub, "page_size") != view.page_size:
        raise PartialPoolError(f"{type(pool).__name__}.index_kv_pool: no k_buffer/v_buffer, mapping or page size")
    ids = inverse(pool, "index_kv_layer_id_mapping", mapping)  # the one reading of a wrapper's id mapping
    kv_rows = _kv_rows(probe(pool, "main_pool"))
    planes.append(_plane("index_kv_pool.k_buffer/v_buffer", [k, v], ids, kv_rows, view.page_size))
    planes += _scale_planes(sub, ids, view.page_size, "index_kv_pool.")
    return planes


def carried_planes(pool: object) -> list[str]:
    """The attributes :func:`describe` describes that ``pool`` has: a MiniMax main pool, a DSA indexer, scales."""
    return [n for n in ("main_pool", "index_k_with_scale_buffer", *SCALE_PLANES) if probe(pool, n) is not None]


def carries_planes(pool: object) -> bool:
    """Whether :func:`describe` has anything to describe."""
    return bool(carried_planes(pool))


def describe(pool: object, view: PoolView) -> WholePool | None:
    """The planes beside ``view``'s KV that share its page ids, or None when there are none."""
    if not carries_planes(pool):
        return None
    page = view.page_size
    if probe(pool, "main_pool") is not None:
        main = probe(pool, "main_pool")
        planes = _minimax(pool, view) + _scale_planes(main, view.layer_ids, page, "main_pool.")
        owners, family, left = [pool, main, probe(pool, "index_kv_pool")], "minimax-sparse", list[LeftOut]()
    else:
        dsa, left = _dsa_index(pool, view)
        planes = dsa + _scale_planes(pool, view.layer_ids, page)
        owners, family = [pool], "dsa" if dsa else "quantised"
    if not planes:
        return None
    _check_accounted(owners, planes, view)
    return WholePool(family, tuple(planes), tuple(left))


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a tensor reaches: a tensor starting where the KV does may hold more than it."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _inside(span: tuple[int, int], covered: list[tuple[int, int]]) -> bool:
    return any(a <= span[0] and span[1] <= b for a, b in covered)


def _check_accounted(owners: Sequence[object], planes: Sequence[Plane], view: PoolView) -> None:
    """Refuse a tensor attribute the description does not cover: it would be lost on a prefix hit."""
    covered = _merged([_span(t) for p in planes for t in p.tensors] + [_span(t) for t in view.tensors()])
    unknown = []
    for owner in owners:
        for attr, value in (vars(owner) if owner is not None and hasattr(owner, "__dict__") else {}).items():
            found = [value] if isinstance(value, torch.Tensor) else _tensors(value) or []
            lost = [t for t in found if t.numel() and not _inside(_span(t), covered)]
            if lost and attr not in DERIVED | PRIMARY | LAYER_METADATA:
                unknown.append(f"{type(owner).__name__}.{attr}")
    if unknown:
        raise PartialPoolError(
            f"{unknown} hold state this adapter does not know how to offload with the KV's pages; offloading "
            f"the rest would restore prefixes without it. Report the pool layout, or serve without FlexKV"
        )


__all__ = ["LeftOut", "PartialPoolError", "Plane", "WholePool", "carried_planes", "carries_planes", "describe"]
