"""Every plane of a pool that shares the KV's page ids, described as one FlexKV layer group each.

A prefix hit restores the KV *and* whatever the model reads beside it at the same page: the
quantisation scales of FP4/MXFP8 pools, the DSA indexer's keys, MiniMax's index KV. FlexKV can
store several tensor groups under one set of block ids (``LayerGroupSpec``), so such a pool is
offloaded whole (:class:`WholePool`). What shares no page ids (per-request state, another index
space) cannot be, and :func:`describe` refuses it by name rather than leave it out silently.
Recognised by attributes, never class names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..config.integers import LIMIT, bounded_integer, looks_numeric, read_flag
from ..errors import InconsistentLayersError
from ..gate import Group, admit
from ..readers.probe import probe, probe_int
from .ids import id_map, inverse
from .planes_state import PartialPoolError, check_accounted

if TYPE_CHECKING:
    from ..model.views import PoolView

# Tables SGLang derives from the planes (pointer and stride arrays for its kernels): not state.
DERIVED = frozenset({"data_ptrs", "k_data_ptrs", "v_data_ptrs", "data_strides", "kv_data_ptrs"})
# Layer ids (read as ids by hybrid_ids/labels; numpy or tensor ids are metadata there, not page-indexed state).
LAYER_METADATA = frozenset(
    {
        "model_layer_ids",
        "mamba_layer_ids",
        "layers_mapping",
        "full_attention_layer_id_mapping",
        "index_kv_layer_id_mapping",
        "index_k_layer_id_mapping",
        "sparse_layer_id_mapping",
    }
)
# The KV planes every view already registers, and the planes described here.
PRIMARY = frozenset({"k_buffer", "v_buffer", "kv_buffer"})
SCALE_PLANES = ("k_scale_buffer", "v_scale_buffer", "kv_scale_buffer")
# What FlexKV lacks for each refused row (docs/flexkv-upstream.md).
SWA_REASON = (
    "sliding-window KV in swa_kv_pool, its own page ids through full_to_swa_index_mapping; FlexKV's standard "
    "registration has no SWA channel (only DeepSeek-V4's) and snapshots one page per node, not a window"
)
MAMBA_REASON = "linear-attention state, one row per request slot; FlexKV has no slot-addressed state channel"


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

    def group(self, page_size: int) -> Group:
        """This plane as the gate checks a registered layer group."""
        per_layer, chunk = 2 if self.kv else 1, self.chunk_bytes(page_size)
        group = Group(self.name, self.tensors, self.layer_ids, per_layer, chunk_bytes=chunk)
        return group._replace(rows_per_block=self.rows_per_block, compress_ratio=self.compress_ratio)


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

    def groups(self, view: PoolView) -> list[Group]:
        """The KV and every plane as the gate's groups, with what FlexKV will read of each (one block's bytes)."""
        first, page = view.tensors()[0], view.page_size
        kv_chunk = page * first[0].numel() * first.element_size()
        kv = Group("KV", tuple(view.tensors()), tuple(view.layer_ids), 2 if view.kind == "mha" else 1)
        kv = kv._replace(chunk_bytes=kv_chunk, rows_per_block=page)
        return [kv, *(p.group(page) for p in self.planes)]

    def describe(self) -> str:
        planes = "; ".join(f"{p.name} ({len(p.tensors)} tensors, layers {list(p.layer_ids)})" for p in self.planes)
        left = "".join(f"; left out: {x.name} ({x.reason})" for x in self.left_out)
        return f"offloaded whole ({self.family}) as FlexKV layer groups: KV, {planes}{left}"


def _tensors(value: object) -> list[torch.Tensor] | None:
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
        return list(value)
    return None


def _again(owner: object, names: Sequence[str]) -> Callable[[], object]:
    """The second read of ``names`` on ``owner``, for the gate's read-twice rule."""

    def again() -> object:
        reads = [_tensors(probe(owner, n)) for n in names]
        return None if any(r is None for r in reads) else [t for r in reads for t in r or ()]

    return again


def _flat(t: torch.Tensor, where: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise PartialPoolError(f"{where} {tuple(t.shape)} is not contiguous; FlexKV copies whole pages of it")
    return t.view(t.shape[0], -1)  # zero-copy; a 5-D plane would otherwise trip FlexKV's K/V stride probe


def _plane(
    owner: object,
    names: Sequence[str],
    lists: Sequence[list[torch.Tensor]],
    ids: Sequence[int],
    kv_rows: int,
    page: int,
) -> Plane:
    """A plane from its per-layer tensors: token-indexed (kv_rows rows) or page-indexed (kv_rows / page).

    Its tensors pass the gate first (real memory, read twice, layers x (K, V) of them, no overlap)."""
    prefix, attrs = names[0].rpartition(".")[0], [n.rpartition(".")[2] for n in names]
    name = f"{prefix}.{'/'.join(attrs)}" if prefix else "/".join(attrs)
    flat = tuple(t for ts in lists for t in ts)
    group = Group(name, flat, tuple(ids), len(lists), _again(owner, attrs))
    admit(f"{type(owner).__name__}{'' if not prefix else ' (' + prefix + ')'}", [group])
    first = lists[0][0]
    rows, row = first.shape[0], first[0].numel()
    if any(t.shape != first.shape or t.dtype != first.dtype for t in flat):
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
    tensors = tuple(_flat(t, name) for t in flat)
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
        return [_plane(pool, [f"{prefix}k_scale_buffer", f"{prefix}v_scale_buffer"], [k, v], ids, kv_rows, page)]
    if kv:
        return [_plane(pool, [f"{prefix}kv_scale_buffer"], [kv], ids, kv_rows, page)]
    raise PartialPoolError(f"{type(pool).__name__} has only one of k_scale_buffer/v_scale_buffer")


def _meta(owner: object, name: str, minimum: int) -> int | None:
    """Pool metadata the planes are sized by, through the one integer rule with its bound; None if absent or not
    a number at all (a method, a string: ignored, as every pool metadata is, docs/layouts.md)."""
    value = probe(owner, name)
    if value is None or not looks_numeric(value):
        return None
    return bounded_integer(value, f"{type(owner).__name__}.{name}", minimum, LIMIT, InconsistentLayersError)


def _flag(owner: object, name: str) -> bool:
    value = probe(owner, name)
    return value is not None and read_flag(value, f"{type(owner).__name__}.{name}", InconsistentLayersError)


def _dsa_index(pool: object, view: PoolView) -> tuple[list[Plane], list[LeftOut]]:
    """The DSA indexer: one uint8 row per page holding page_size / index_kpool tokens."""
    buffers = _tensors(probe(pool, "index_k_with_scale_buffer"))
    if buffers is None:
        return [], []
    name, page = type(pool).__name__, view.page_size
    kpool = _meta(pool, "index_kpool", 1) or 1
    if page % kpool:
        raise InconsistentLayersError(
            f"{name}.index_kpool={kpool} does not divide the page size {page}: each index row holds page_size / "
            f"index_kpool tokens, so the indexer's rows cannot be matched to the KV's pages"
        )
    use_compress, compress = _flag(pool, "kpool_use_compress"), _flag(pool, "index_kpool_compress")
    if use_compress or (kpool > 1 and compress):
        raise PartialPoolError(
            f"{name} compresses its indexer with kpool={kpool}: the compress tails (_compress_tail_k/"
            f"_compress_tail_score) hold one row per request slot, not per page, and FlexKV has no slot-addressed "
            f"channel to store them with the pages (docs/flexkv-upstream.md); a restored prefix would lose them"
        )
    index_page = _meta(pool, "index_page_size", 1)
    size, buf_size = _meta(pool, "size", 0), _meta(pool, "index_buf_size", 0)
    if (index_page is not None and index_page != page // kpool) or (buf_size is not None and buf_size != size):
        raise PartialPoolError(
            f"{name}: its indexer pages ({index_page} tokens, {buf_size} rows) do not follow the KV's pages "
            f"({page} / kpool {kpool}, {size} rows), as under decode context parallelism (dcp > 1); the KV's "
            f"page ids would address other index rows"
        )
    if len(buffers) != len(view.layer_ids):
        raise PartialPoolError(f"{name}: {len(buffers)} index buffers for {len(view.layer_ids)} KV layers")
    empty = [t.ndim >= 1 and t.shape[0] == 0 for t in buffers]  # 0-row layers reuse the previous top-k
    skipped = [lid for lid, e in zip(view.layer_ids, empty) if e]
    kept = [(lid, t) for lid, t, e in zip(view.layer_ids, buffers, empty) if not e]
    left = [LeftOut(f"index_k_with_scale_buffer of layers {skipped}", "0 rows: they reuse the previous top-k")]
    left = left if skipped else []
    if not kept:
        return [], left
    tensors = tuple(t for _, t in kept)

    def again() -> object:
        second = _tensors(probe(pool, "index_k_with_scale_buffer")) or []
        return [t for t, e in zip(second, empty) if not e] if len(second) == len(empty) else None

    admit(name, [Group("index_k_with_scale_buffer", tensors, tuple(lid for lid, _ in kept), 1, again)])
    tokens_per_row = page // kpool
    first = tensors[0]
    if first.ndim != 2 or first.shape[1] % tokens_per_row:
        raise PartialPoolError(f"{name}: index rows {tuple(first.shape)} do not hold {tokens_per_row} tokens each")
    if any(t.shape != first.shape or t.dtype != first.dtype for t in tensors) or first.shape[0] < view.num_blocks:
        raise PartialPoolError(f"{name}: index buffers differ in shape or hold fewer pages than the KV")
    plane = Plane(
        "index_k_with_scale_buffer",
        tuple(_flat(t, "index_k_with_scale_buffer") for t in tensors),
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
    names = ["index_kv_pool.k_buffer", "index_kv_pool.v_buffer"]
    planes.append(_plane(sub, names, [k, v], ids, kv_rows, view.page_size))
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
    check_accounted(owners, [t for p in planes for t in p.tensors] + view.tensors(), DERIVED | PRIMARY | LAYER_METADATA)
    return WholePool(family, tuple(planes), tuple(left))


__all__ = ["LeftOut", "PartialPoolError", "Plane", "WholePool", "carried_planes", "carries_planes", "describe"]
