"""Every plane of a pool that shares the KV's page ids, described as one FlexKV layer group each.

A prefix hit restores the KV *and* whatever the model reads beside it at the same page: the
quantisation scales of FP4/MXFP8 pools, the DSA indexer's keys, MiniMax's index KV. FlexKV can
store several tensor groups under one set of block ids (``LayerGroupSpec``), so such a pool is
offloaded whole (:class:`WholePool`). What shares no page ids (per-request state, another index
space) cannot be, and :func:`describe` refuses it by name rather than leave it out silently; so is any
tensor the pool holds that no registered group covers (:func:`check_accounted`). Recognised by
attributes, never class names; each plane passes the gate its caller hands in as it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ..config.integers import LIMIT, bounded_integer, looks_numeric, read_flag
from ..errors import InconsistentLayersError
from ..model.hybrid import DERIVED, LAYER_METADATA, LeftOut, PartialPoolError, Plane, WholePool
from ..model.layer_group import Admit, Group
from .containers import probe, probe_int
from .wrappers import SCALE_PLANES, id_map, inverse

if TYPE_CHECKING:
    from ..model.views import PoolView

# The KV planes every view already registers, and the planes described here.
PRIMARY = frozenset({"k_buffer", "v_buffer", "kv_buffer"})


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
    admit: Admit,
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


def _scale_planes(admit: Admit, pool: object, ids: Sequence[int], page: int, prefix: str = "") -> list[Plane]:
    """FP4/MXFP8 scales: without them the stored bytes cannot be dequantised."""
    k, v, kv = (_tensors(probe(pool, n)) for n in SCALE_PLANES)
    if not (k or v or kv):
        return []
    kv_rows = _kv_rows(pool)
    if k and v:
        return [_plane(admit, pool, [f"{prefix}k_scale_buffer", f"{prefix}v_scale_buffer"], [k, v], ids, kv_rows, page)]
    if kv:
        return [_plane(admit, pool, [f"{prefix}kv_scale_buffer"], [kv], ids, kv_rows, page)]
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


def _dsa_index(admit: Admit, pool: object, view: PoolView) -> tuple[list[Plane], list[LeftOut]]:
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


def _minimax(admit: Admit, pool: object, view: PoolView) -> list[Plane]:
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
    planes.append(_plane(admit, sub, names, [k, v], ids, kv_rows, view.page_size))
    planes += _scale_planes(admit, sub, ids, view.page_size, "index_kv_pool.")
    return planes


# Everything a pool owner holds in tensors, wherever Python keeps it (instance attributes, ``__slots__``,
# dict attributes such as an ``nn.Module``'s ``_buffers``): a pool offloaded whole leaves nothing out unnamed.
def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a tensor reaches: a tensor starting where the KV does may hold more than it."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0) if t.numel() else -1
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


def _slots(owner: object) -> Iterator[str]:
    for cls in type(owner).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        yield from ([slots] if isinstance(slots, str) else slots)


def _values(owner: object) -> Iterator[tuple[str, object]]:
    """(name, value) of every attribute an owner keeps: its ``__dict__`` and its ``__slots__``."""
    found = probe(owner, "__dict__", tolerate=True)
    if isinstance(found, dict):
        yield from list(found.items())
    for name in _slots(owner):
        if name not in ("__dict__", "__weakref__"):
            yield name, probe(owner, name, tolerate=True)


def _tensors_in(name: str, value: object) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors a value holds: itself, a list/tuple of them, or the values of a dict (one level)."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        yield from ((name, t) for t in value if isinstance(t, torch.Tensor))
    elif isinstance(value, Mapping):
        try:
            items = list(value.items())
        except Exception:  # a mapping that cannot be listed holds nothing we could account for
            return
        for key, item in items:
            key_name = key if isinstance(key, str) else repr(key)[:40]
            for _, t in _tensors_in(key_name, item):
                yield (f"{name}[{key_name!r}]", t)


def check_accounted(owners: Sequence[object], registered: Sequence[torch.Tensor], known: frozenset[str]) -> None:
    """Refuse a tensor an owner holds whose bytes ``registered`` does not cover: it would be lost on a prefix hit.
    Attributes named in ``known`` (the KV planes, derived pointer tables, layer ids) are not state."""
    covered = _merged([_span(t) for t in registered])
    unknown = []
    for owner in owners:
        if owner is None:
            continue
        for attr, value in _values(owner):
            if attr in known:
                continue
            lost = [n for n, t in _tensors_in(attr, value) if _real(t) and not _inside(_span(t), covered)]
            lost = [n for n in lost if n.partition("[")[2].strip("'\"]") not in known]
            if lost:
                unknown.append(f"{type(owner).__name__}.{lost[0]}")
    if unknown:
        raise PartialPoolError(
            f"{unknown} hold state this adapter does not know how to offload with the KV's pages; offloading "
            f"the rest would restore prefixes without it. Report the pool layout, or serve without FlexKV"
        )


def _real(t: torch.Tensor) -> bool:
    try:
        return bool(t.numel()) and not t.is_meta
    except Exception:
        return False


def carried_planes(pool: object) -> list[str]:
    """The attributes :func:`describe` describes that ``pool`` has: a MiniMax main pool, a DSA indexer, scales."""
    return [n for n in ("main_pool", "index_k_with_scale_buffer", *SCALE_PLANES) if probe(pool, n) is not None]


def carries_planes(pool: object) -> bool:
    """Whether :func:`describe` has anything to describe."""
    return bool(carried_planes(pool))


def describe(pool: object, view: PoolView, admit: Admit) -> WholePool | None:
    """The planes beside ``view``'s KV that share its page ids, or None when there are none.

    Each plane passes ``admit`` (the gate, :func:`~flexkv_adapter.gate.admit`, handed down by its caller) as it
    is read, before its shape is checked."""
    if not carries_planes(pool):
        return None
    page = view.page_size
    if probe(pool, "main_pool") is not None:
        main = probe(pool, "main_pool")
        planes = _minimax(admit, pool, view) + _scale_planes(admit, main, view.layer_ids, page, "main_pool.")
        owners, family, left = [pool, main, probe(pool, "index_kv_pool")], "minimax-sparse", list[LeftOut]()
    else:
        dsa, left = _dsa_index(admit, pool, view)
        planes = dsa + _scale_planes(admit, pool, view.layer_ids, page)
        owners, family = [pool], "dsa" if dsa else "quantised"
    if not planes:
        return None
    check_accounted(owners, [t for p in planes for t in p.tensors] + view.tensors(), DERIVED | PRIMARY | LAYER_METADATA)
    return WholePool(family, tuple(planes), tuple(left))


__all__ = ["LeftOut", "PartialPoolError", "Plane", "WholePool", "carried_planes", "carries_planes", "describe"]
