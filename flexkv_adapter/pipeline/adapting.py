"""``adapt(pool)``: recognise, carve, check, align, and wrap a pool as a FlexKV-ready view.

A vLLM 0.33 cache dict takes its own first steps (:func:`adapt_vllm`: geometry and FlexKV form from the
strides, :mod:`~flexkv_adapter.readers.vllm_layout`), then the common builder like every other source.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from typing_extensions import Unpack

from ..errors import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    NotAddressableError,
    UnsupportedPoolError,
    describe,
)
from ..model.axes import parse_axes
from ..model.hybrid import SideGroup
from ..model.layout import Geometry, Interpretation, ViewKind
from ..model.views import MLAView, PoolView
from ..readers.containers import Located, own_class, probe, probe_path
from ..readers.options import AdaptOptions, validate_options
from ..readers.recognize import candidates, declared_axes, locate, mismatch, vllm_twin_of
from ..readers.sources import Source, locate_source
from ..readers.vllm_layout import ONE_HEAD_FIX, read_geometry, resolve_kind, vllm_form
from ..readers.wrappers import plane_groups, scale_groups
from .build import apply_policy, build_view
from .carve import Planes, apply_declared_shape, flat_views, logical_views, rows_heads_dim, signature
from .metadata import mapped_layer_ids, named_sub_pool_ids, resolve_geometry

logger = logging.getLogger(__name__)

_HYBRID_MARKERS = ("full_kv_pool", "swa_kv_pool", "mamba_pool", "main_pool", "unified_kv_pool", "c4_kv_pool")


def adapt(pool: object, page_size: int | None = None, **options: Unpack[AdaptOptions]) -> PoolView:
    """Wrap ``pool`` as an :class:`MHAView` or :class:`MLAView` that FlexKV can register.

    Every exposed tensor aliases the pool's memory (nothing is copied), is C-contiguous
    ``[rows, heads, dim]``, and has rows trimmed to a multiple of ``page_size``. Geometry comes
    from the pool's metadata (``layer_num``, ``head_num``, ``head_dim``, ``page_size``, ...) and
    from ``options`` (see :class:`AdaptOptions`). ``adapt`` of a view returns it unchanged.

    Order of precedence: ``spec=``; explicit ``attrs=``/``axes=``; hybrid wrappers (unwrapped to
    their attention sub-pool, other state exposed as ``view.side_groups``); recogniser plugins;
    user-registered and built-in attribute names. Explicit ``attrs=`` (dotted paths allowed) are
    read as named: a hybrid wrapper is then not unwrapped. Options are validated once, on entry.

    The steps, the same for every input: validate options (one integer reader); make the input one
    :class:`~flexkv_adapter.readers.sources.Source` record; read metadata from the tensors' owners; locate
    the tensors (each attribute read twice: copies are refused); list the readings that fit (two
    readings, nested or not, are an ambiguity); carve, check extents and FlexKV's alignment; label
    the layers; apply the hybrid policy. :func:`~flexkv_adapter.flexkv.plan` runs the same steps.

    Raises:
        UnsupportedPoolError: nothing in the pool reads as KV buffers (lists every reason).
        HybridPoolError: a hybrid pool without ``hybrid="attention_only"`` (names what is left out).
        AmbiguousLayoutError: several readings fit; pass ``axes=``/``attrs=`` or geometry.
        NotAddressableError: the only view FlexKV could get would be misread (non-contiguous).
        InconsistentLayersError: layers or K/V disagree, or an option contradicts the pool.
        AdapterError: anything else that must be refused (e.g. rows < page_size).
    """
    given: dict[str, Any] = validate_options(options)
    page_size = validate_options({}, page_size).get("page_size")
    own_class(pool, "adapt(pool)")
    if isinstance(pool, PoolView):
        if given or (page_size is not None and page_size != pool.page_size):
            raise AdapterError(
                f"{pool!r} is already adapted; to change options adapt its source: adapt(view.source, ...)"
            )
        return pool
    return adapt_source(locate_source(pool, page_size, given))  # every input becomes one record


def adapt_source(source: Source) -> PoolView:
    """The rest of the pipeline for a located record (:func:`~flexkv_adapter.flexkv.plan` enters here too)."""
    if source.vllm:
        kind, ids = source.options.get("kind"), source.options.get("layer_ids")
        return adapt_vllm(source.pool, source.page_size, kind, ids)  # type: ignore[arg-type]
    view = _adapt_plain(source.holder, source.page_size, source.options, source.label)
    return _label_and_policy(source, view)


def _label_and_policy(source: Source, view: PoolView) -> PoolView:
    """Global layer ids from a hybrid wrapper's mapping, then the hybrid policy over what is left out."""
    pool, given, structure = source.pool, source.options, source.structure
    if structure is not None:
        view = mapped_layer_ids(pool, structure, view, set(given))
        groups = [*structure.side_groups, *plane_groups(structure.primary, view.layer_ids, "")]
        _check_disjoint(pool, view, groups)
        return apply_policy(view, pool, structure.family, groups, source.mode)
    if given.get("attrs"):
        view = named_sub_pool_ids(pool, given["attrs"], view, set(given))
    wrappers = hybrid_markers(pool) if given.get("attrs") else []
    if wrappers:
        note = f"explicit attrs={list(given['attrs'])} read as named; hybrid wrapper attributes not unwrapped: "
        view = view.rebuild(report=replace(view.report, notes=(*view.report.notes, note + ", ".join(wrappers))))
    groups = _named_planes(pool, given.get("attrs"), view.layer_ids)
    return apply_policy(view, pool, view.report.recognizer, groups, source.mode)


def _named_planes(pool: object, attrs: Any, layer_ids: list[int]) -> list[SideGroup]:
    """Scale planes beside the KV, and those of each sub-object ``attrs=`` reach into (``inner.kv_buffer``):
    a child's scales or DSA indexer, which only that child shows, are listed, never left out unnamed."""
    groups = scale_groups(pool, layer_ids)
    for owner in sorted({str(a).rpartition(".")[0] for a in attrs or ()} - {""}):
        if (sub := probe_path(pool, owner)) is not None:
            groups += plane_groups(sub, layer_ids, f"{owner}.")
    return groups


def _check_disjoint(pool: object, view: PoolView, groups: list[SideGroup]) -> None:
    """SWA and Mamba layers are never attention layers: a label naming one was guessed (no id mapping)."""
    other = {lid for g in groups if g.index_space in ("swa_token", "mamba_slot") for lid in g.layer_ids}
    if clash := sorted(other & set(view.layer_ids)):
        raise InconsistentLayersError(
            f"{type(pool).__name__}: attention layers labelled {view.layer_ids} include {clash}, which are SWA or "
            f"Mamba layers; the wrapper does not say where its attention layers sit (no layer id mapping, no "
            f"model_layer_ids). Pass layer_ids=[...] with their model layer ids"
        )


def hybrid_markers(pool: object) -> list[str]:
    """The wrapper attributes ``pool`` carries (read tolerantly: a marker is a hint, never an error)."""
    return [m for m in _HYBRID_MARKERS if probe(pool, m, tolerate=True) is not None]


def _adapt_plain(pool: object, page_size: int | None, options: Any, label: str | None) -> PoolView:
    geometry = resolve_geometry(pool, page_size, options)
    located, interp, planes = recognise(pool, geometry, options)
    view = build_view(pool, located, interp, planes, geometry)
    return view.rebuild(report=replace(view.report, recognizer=label)) if label else view


def recognise(
    pool: object, geometry: Geometry, options: AdaptOptions, *, views: bool = True
) -> tuple[Located, Interpretation, Planes]:
    """The one reading of the pool's tensors that fits, with its canonical-order views.

    ``views``: the caller needs flat views (adapt()), so readings that all fit but none of which gives
    them are NotAddressableError, not an ambiguity; plan()'s as-is path registers some of those whole.
    """
    found, declined = locate(pool, geometry.attrs)
    fits: list[tuple[Located, Interpretation]] = []
    misfits: list[tuple[Located, Interpretation, str]] = []
    for located in found:
        located = apply_declared_shape(located, geometry, options, pool)
        for interp in candidates(located, geometry):
            why = mismatch(located, interp, geometry)
            if why is None:
                fits.append((located, interp))
            else:
                misfits.append((located, interp, why))
    if not fits:
        misfits.sort(key=lambda m: not _shape_agrees(m[0], m[1]))  # the reading that got furthest speaks first
        reasons = [*(f"{loc.family} ({'/'.join(loc.attrs)}) as {i}: {why}" for loc, i, why in misfits), *declined]
        raise _unsupported(pool, reasons)
    if geometry.axes is None:
        for loc, interp in fits:
            if twin := vllm_twin_of(loc, interp):
                raise AmbiguousLayoutError(f"{type(pool).__name__}.{twin}")
    return _choose(pool, fits, views)


def _none_addressable(pool: object, readings: list[tuple[Located, Interpretation, Planes]]) -> str | None:
    """The first reading's refusal when no reading gets flat views: asking which one is meant would not
    help, since each would be refused (vLLM >= 0.23's ``[NB, 2, BS, H, D]`` read token- or head-major)."""
    refusals = []
    for loc, interp, planes in readings:
        try:
            flat_views(planes, interp, pool, loc.attrs)
        except NotAddressableError as e:
            refusals.append(str(e))
        else:
            return None
    return refusals[0]


def _shape_agrees(located: Located, interp: Interpretation) -> bool:
    """Whether every tensor has the reading's rank: its refusal then names a size (rows under a page,
    a head count), which says more than a reading of the wrong rank or an attribute that is absent."""
    return all(t.ndim == len(interp.axes) for c in located.containers for t in c.tensors)


def _unsupported(pool: object, reasons: list[str]) -> UnsupportedPoolError:
    name = type(pool).__name__
    hybrid = hybrid_markers(pool)
    lines = [f"Unsupported KV cache type {name}: no recogniser found FlexKV-ready KV buffers."]
    if hybrid:
        lines.append(
            f"It looks like a hybrid wrapper ({', '.join(hybrid)}); hybrid pools are not adapted by "
            f"this version: adapt the full-attention sub-pool explicitly only if you accept losing the rest."
        )
    lines += [f"  - {r}" for r in reasons] or ["  - it is not a tensor, sequence, dict, or object with KV attributes"]
    lines.append(
        "Fix: pass attrs=[...] naming the tensor attribute(s), axes='...' for their layout, and the "
        "geometry (layer_num=, head_num=, head_dim=, page_size=), or register_attribute_names(...)."
    )
    return UnsupportedPoolError("\n".join(lines))


def _choose(
    pool: object, fits: list[tuple[Located, Interpretation]], views: bool
) -> tuple[Located, Interpretation, Planes]:
    """The one reading that fits, after merging readings that address the same bytes."""
    readings = [(loc, interp, logical_views(loc, interp)) for loc, interp in fits]
    if len(readings) == 1:
        return readings[0]
    distinct: dict[tuple[object, ...], tuple[Located, Interpretation, Planes]] = {}
    for reading in readings:  # the same bytes under other layer names are another reading
        named = next((c.layer_ids for c in reading[0].containers if c.layer_ids), None)
        distinct.setdefault((signature(reading[2]), named), reading)
    if len(distinct) == 1:
        return readings[0]
    listed = []
    for loc, interp, planes in distinct.values():
        first = next(iter(planes.values()))
        rows, heads, dim = rows_heads_dim(first[0])
        listed.append(
            f"  - {loc.family} attrs={list(loc.attrs)} axes='{declared_axes(loc, interp)}' "
            f"({interp.kind}): {len(first)} layers of {rows} rows x {heads} heads x {dim}"
        )
    tensors = {c.attr: c.tensors[0] for loc, _ in fits for c in loc.containers}
    shown = "; ".join(f"{a}: {describe(t)}" for a, t in tensors.items())
    if views and (refusal := _none_addressable(pool, list(distinct.values()))):  # plan() registers some as they are
        raise NotAddressableError(
            f"{type(pool).__name__}: {len(distinct)} readings of the KV tensors fit ({shown}), and FlexKV can "
            "address none of them, whichever is meant:\n" + "\n".join(listed) + f"\nThe first: {refusal}"
        )
    raise AmbiguousLayoutError(
        f"{type(pool).__name__}: {len(distinct)} readings of the KV tensors fit ({shown}):\n"
        + "\n".join(listed)
        + "\nFix: pass axes='...' (and attrs=[...]) for the right one, or the geometry that rules the "
        "others out (layer_num=, head_num=, head_dim=, page_size=, kind=)."
    )


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
