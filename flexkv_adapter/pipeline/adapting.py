"""``adapt(pool)``: recognise, carve, check, align, and wrap a pool as a FlexKV-ready view."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from typing_extensions import Unpack

from ..errors import AdapterError, AmbiguousLayoutError, InconsistentLayersError, UnsupportedPoolError, describe
from ..hybrid import detect as hybrid
from ..model.layout import Geometry, Interpretation
from ..model.views import PoolView
from ..readers.containers import Located
from ..readers.probe import probe, probe_path
from ..readers.recognize import candidates, declared_axes, locate, mismatch, vllm_twin_of
from .build import build_view
from .bytebuf import apply_declared_shape
from .carve import Planes, logical_views, rows_heads_dim, signature
from .labels import mapped_layer_ids, named_sub_pool_ids
from .options import AdaptOptions, resolve_geometry, validate_options
from .sources import Source, locate_source
from .vllm_view import adapt_vllm

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
    :class:`~flexkv_adapter.pipeline.sources.Source` record; read metadata from the tensors' owners; locate
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
        groups = [*structure.side_groups, *hybrid.plane_groups(structure.primary, view.layer_ids, "")]
        _check_disjoint(pool, view, groups)
        return hybrid.apply_policy(view, pool, structure.family, groups, source.mode)
    if given.get("attrs"):
        view = named_sub_pool_ids(pool, given["attrs"], view, set(given))
    wrappers = hybrid_markers(pool) if given.get("attrs") else []
    if wrappers:
        note = f"explicit attrs={list(given['attrs'])} read as named; hybrid wrapper attributes not unwrapped: "
        view = view.rebuild(report=replace(view.report, notes=(*view.report.notes, note + ", ".join(wrappers))))
    groups = _named_planes(pool, given.get("attrs"), view.layer_ids)
    return hybrid.apply_policy(view, pool, view.report.recognizer, groups, source.mode)


def _named_planes(pool: object, attrs: Any, layer_ids: list[int]) -> list[hybrid.SideGroup]:
    """Scale planes beside the KV, and those of each sub-object ``attrs=`` reach into (``inner.kv_buffer``):
    a child's scales or DSA indexer, which only that child shows, are listed, never left out unnamed."""
    groups = hybrid.scale_groups(pool, layer_ids)
    for owner in sorted({str(a).rpartition(".")[0] for a in attrs or ()} - {""}):
        if (sub := probe_path(pool, owner)) is not None:
            groups += hybrid.plane_groups(sub, layer_ids, f"{owner}.")
    return groups


def _check_disjoint(pool: object, view: PoolView, groups: list[hybrid.SideGroup]) -> None:
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


def recognise(pool: object, geometry: Geometry, options: AdaptOptions) -> tuple[Located, Interpretation, Planes]:
    """The one reading of the pool's tensors that fits, with its canonical-order views."""
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
        reasons = [*declined, *(f"{loc.family} ({'/'.join(loc.attrs)}) as {i}: {why}" for loc, i, why in misfits)]
        raise _unsupported(pool, reasons)
    if geometry.axes is None:
        for loc, interp in fits:
            if twin := vllm_twin_of(loc, interp):
                raise AmbiguousLayoutError(f"{type(pool).__name__}.{twin}")
    return _choose(pool, fits)


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


def _choose(pool: object, fits: list[tuple[Located, Interpretation]]) -> tuple[Located, Interpretation, Planes]:
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
    raise AmbiguousLayoutError(
        f"{type(pool).__name__}: {len(distinct)} readings of the KV tensors fit ({shown}):\n"
        + "\n".join(listed)
        + "\nFix: pass axes='...' (and attrs=[...]) for the right one, or the geometry that rules the "
        "others out (layer_num=, head_num=, head_dim=, page_size=, kind=)."
    )
