"""The one builder of views: a located reading in, a labelled :class:`~flexkv_adapter.model.views.PoolView` out.

Every source ends here (a pool, a spec or plugin reading, a hybrid's attention sub-pool, a vLLM 0.33
dict), so a rule added here applies to all of them; :data:`RULES` names the rules, in order, for the
tests that prove each one reaches every source.

The layers' global ids come from ``layer_ids=``, a dict's names, ``model_layer_ids`` or ``start_layer``
(:func:`layer_ids_of`), or from a hybrid wrapper's mapping (:func:`mapped_layer_ids`). Each source that is
present must agree with the others; a contradiction is an error, never a silent choice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import torch

from ..config.integers import read_integer_list
from ..errors import AdapterError, AmbiguousLayoutError, InconsistentLayersError, describe
from ..gate import Group, admit
from ..model.axes import Axis
from ..model.hybrid import HybridStructure
from ..model.layout import Geometry, Interpretation
from ..model.report import Report
from ..model.views import MHAView, MLAView, PoolView
from ..readers.containers import Container, Located, attr_owners, layer_index_from_name, probe, probe_int
from ..readers.recognize import reading_text
from ..readers.sources import check_wrapper_page_size
from ..readers.wrappers import detect
from ..text import short_repr
from .carve import (
    Planes,
    aliased_bytes,
    check_consistent,
    check_flexkv_alignment,
    flat_views,
    reinterpret,
    trim_rows,
)

logger = logging.getLogger(__name__)

#: The rules :func:`build_view` applies, by the function that applies each.
RULES = (
    "page_size_of",
    "flat_views",
    "check_consistent",
    "check_flexkv_alignment",
    "aliased_bytes",
    "layer_ids_of",
    "admit",
)


def page_size_of(pool: object, geometry: Geometry, interp: Interpretation, planes: Planes) -> int:
    """Tokens per FlexKV block: the argument or pool metadata, else the layout's page axis; never a guess."""
    if geometry.page_size is not None:
        return geometry.page_size
    if Axis.TOKEN in interp.axes:
        return int(next(iter(planes.values()))[0].shape[1])
    raise AdapterError(
        f"{type(pool).__name__}: page size unknown (no page_size argument, no pool.page_size, no page "
        f"axis in the layout); pass adapt(pool, page_size=<tokens per FlexKV block>)"
    )


def build_view(pool: object, located: Located, interp: Interpretation, logical: Planes, geometry: Geometry) -> PoolView:
    """The view of one reading: every rule between a reading and a view, for every source (vLLM dicts too).

    Flat C-contiguous views (:func:`~.carve.flat_views`), layers that agree, the page size and whole
    blocks, FlexKV's block alignment, the zero-copy proof, the layer labels and the overlap refusal.
    """
    attrs = located.attrs
    page_size = page_size_of(pool, geometry, interp, logical)
    planes = flat_views(logical, interp, pool, attrs)
    check_consistent(planes, pool, attrs)  # as stored: dtype= must not make fp16 and bf16 layers look alike
    if geometry.dtype is not None:
        try:
            planes = reinterpret(planes, geometry.dtype)
        except RuntimeError as exc:
            raise AdapterError(f"{type(pool).__name__}: cannot view the KV bytes as {geometry.dtype}: {exc}") from None
    first = next(iter(planes.values()))[0]
    rows = first.shape[0]
    if rows < page_size:
        raise AdapterError(
            f"{type(pool).__name__}.{'/'.join(attrs)}: {rows} rows per layer ({describe(first)}) is fewer "
            f"than page_size={page_size}; FlexKV needs at least one whole block"
        )
    aligned = rows - rows % page_size
    if aligned != rows:
        planes = trim_rows(planes, aligned)
        logger.info(
            "%s: trimmed rows %d -> %d (dropped %d) to a multiple of page_size %d",
            type(pool).__name__,
            rows,
            aligned,
            rows - aligned,
            page_size,
        )
    check_flexkv_alignment(planes, page_size, pool, attrs)
    sources = [t for c in located.containers for t in c.tensors]
    aliased, copied = aliased_bytes(planes, sources)
    if copied:
        raise AdapterError(f"internal error: {copied} bytes of the views do not alias the pool; please report")
    count = len(first_list := next(iter(planes.values())))
    layer_ids = layer_ids_of(pool, located, count, geometry)
    where = f"{type(pool).__name__}.{'/'.join(attrs)}"
    warnings = admit(where, [Group(plane, tuple(views), tuple(layer_ids)) for plane, views in planes.items()])
    logical_dtype = None if isinstance(pool, torch.Tensor) else probe(pool, "dtype")
    stored = first_list[0]
    if isinstance(logical_dtype, torch.dtype) and logical_dtype.itemsize != stored.element_size():
        warnings.append(
            f"pool.dtype {logical_dtype} has itemsize {logical_dtype.itemsize} but the buffers hold {stored.dtype}; "
            f"FlexKV sizes GPU blocks with its model dtype, which must have itemsize {stored.element_size()}"
        )
    for w in warnings:
        logger.warning("%s: %s", type(pool).__name__, w)
    report = Report(
        source_kind=type(pool).__name__,
        recognizer=located.family,
        attributes=attrs,
        reading=reading_text(located, interp),
        kind=interp.kind,
        layer_ids=tuple(layer_ids),
        excluded_layers=(),
        page_size=page_size,
        rows=rows,
        aligned_rows=aligned,
        num_blocks=aligned // page_size,
        dtype=str(first_list[0].dtype).removeprefix("torch."),
        device=str(first_list[0].device),
        bytes_aliased=aliased,
        bytes_copied=copied,
        warnings=tuple(warnings),
    )
    logger.debug("adapted %s", report)
    common = dict(
        source=pool,
        layer_ids=layer_ids,
        page_size=page_size,
        num_blocks=aligned // page_size,
        dtype=first_list[0].dtype,
        device=first_list[0].device,
        report=report,
    )
    if interp.kind == "mla":
        return MLAView(planes["kv"], **common)  # type: ignore[arg-type]
    return MHAView(planes["k"], planes["v"], **common)  # type: ignore[arg-type]


def layer_ids_of(pool: object, located: Located, count: int, geometry: Geometry) -> list[int]:
    """Global layer ids, in the order of the views.

    A dict's ``layer_ids=`` are given in the dict's order; when its names give ids too, the two
    must agree. ``start_layer`` does not apply to a dict (its names, or ``layer_ids=``, give ids).
    """
    # the ids in names, from K or V (pairing_problem made sure that both give the same, or one none)
    container: Container = next((c for c in located.containers if c.layer_ids), located.containers[0])
    name = type(pool).__name__
    if container.keyed and "start_layer" in geometry.given:
        raise AdapterError(
            f"{name}: start_layer= does not apply to a dict of layers: the names give the ids"
            f"{f' {list(container.layer_ids)}' if container.layer_ids else ''}; pass layer_ids=[...] "
            f"in the dict's order instead"
        )
    given = geometry.layer_ids
    if given is not None and len(given) != count:
        raise AdapterError(f"layer_ids has {len(given)} entries but the pool has {count} layers")
    if given is not None and container.dict_order is not None:
        given = tuple(given[i] for i in container.dict_order)  # the dict's order -> the views' order
        if container.layer_ids is not None and given != container.layer_ids:
            raise InconsistentLayersError(
                f"{name}: layer_ids={list(geometry.layer_ids or ())} (in the dict's order) contradicts the layer "
                f"indices in the names ({list(container.layer_ids)} in index order); drop layer_ids or fix the names"
            )
        if container.layer_ids is None and container.names is not None:  # partly named: those names must agree
            names_layer_ids(container.names, given, name)
    model_ids = owners_model_ids(pool, geometry.attrs, count)
    if given is not None:
        _agree(name, f"layer_ids={list(given)}", list(given), model_ids)
        return list(given)
    if container.ids_problem:
        raise AmbiguousLayoutError(f"{name}: {container.ids_problem}")
    if container.layer_ids is not None:
        return list(container.layer_ids)
    if model_ids is not None:
        if "start_layer" in geometry.given:
            start = geometry.start_layer
            _agree(name, f"start_layer={start}", list(range(start, start + count)), model_ids)
        return model_ids
    return list(range(geometry.start_layer, geometry.start_layer + count))


def names_layer_ids(names: Sequence[object], given: Sequence[int] | None, where: str) -> list[int]:
    """Layer ids of a dict's entries in the dict's order: from ``layer_ids=`` or the names, which must agree.

    An entry whose name holds no layer index (``mtp.attn``) is never labelled by its position: without
    ``layer_ids=`` that is an AmbiguousLayoutError, as for any other dict.
    """
    parsed = [layer_index_from_name(n) for n in names]
    if given is not None:
        if len(given) != len(names):
            raise AdapterError(f"{where}: layer_ids has {len(given)} entries but the dict has {len(names)} layers")
        if clash := [(n, p, g) for n, p, g in zip(names, parsed, given) if p is not None and p != g]:
            name, index, wanted = clash[0]
            raise InconsistentLayersError(
                f"{where}: layer_ids={short_repr(list(given))} (in the dict's order) contradicts the names: "
                f"{short_repr(name)} holds layer {index}, not {wanted}; drop layer_ids or fix the names"
            )
        return list(given)
    if any(p is None for p in parsed) or len(set(parsed)) != len(parsed):
        unnamed = [short_repr(n) for n, p in zip(names, parsed) if p is None][:3]
        raise AmbiguousLayoutError(
            f"{where}: cannot take one distinct layer index from each name ({', '.join(unnamed) or 'repeated'}"
            f"{' hold none' if unnamed else ''}); pass layer_ids=[...] in the dict's order"
        )
    return parsed  # type: ignore[return-value]


def owners_model_ids(pool: object, attrs: tuple[str, ...] | None, count: int) -> list[int] | None:
    """``model_layer_ids`` of the object(s) holding the named tensors
    (:func:`~flexkv_adapter.readers.containers.attr_owners`, the one owner rule metadata is read by too); two
    owners that disagree are an error."""
    found = [(p, ids) for p, owner in attr_owners(pool, attrs) if (ids := _model_layer_ids(owner, count)) is not None]
    if len({tuple(ids) for _, ids in found}) > 1:
        shown = "; ".join(f"{p or 'pool'}.model_layer_ids={short_repr(ids)}" for p, ids in found)
        raise InconsistentLayersError(f"{type(pool).__name__}: the attrs= owners disagree: {shown}")
    return found[0][1] if found else None


def _model_layer_ids(pool: object, count: int) -> list[int] | None:
    """SGLang's ``model_layer_ids``: the global ids of this pool's layers, if it has them."""
    model_ids = probe(pool, "model_layer_ids")
    if model_ids is None:
        return None
    where = f"{type(pool).__name__}.model_layer_ids"
    ids = read_integer_list(model_ids, where, InconsistentLayersError)  # numpy/torch 1-D arrays too
    if len(ids) != count or len(set(ids)) != count:
        raise InconsistentLayersError(
            f"{where}={short_repr(model_ids, 200)}: expected {count} distinct layer ids (integers), one per layer"
        )
    return ids


def compact_default(sub: object, count: int) -> bool:
    """Whether ``sub.model_layer_ids`` is SGLang's compact default ``range(start_layer, start_layer + n)``.

    SGLang 0.5.23 patches the wrapper's ids onto an MHA child only (``memory_pool.py``, "Only the hybrid
    root knows the model IDs of its compact child"); an MLA child keeps this default, which says nothing
    about where its layers sit in the model: the wrapper's mapping is the truth there.
    """
    start = probe_int(sub, "start_layer") or 0
    ids = _model_layer_ids(sub, count)
    return ids is None or ids == list(range(start, start + count))


def _agree(name: str, option: str, ids: list[int], model_ids: list[int] | None) -> None:
    if model_ids is not None and ids != model_ids:
        raise InconsistentLayersError(
            f"{name}: option {option} gives layers {ids} but {name}.model_layer_ids is {model_ids}; "
            f"drop the option or fix the pool"
        )


def mapped_layer_ids(pool: object, structure: HybridStructure, view: PoolView, options: set[str]) -> PoolView:
    """The view labelled with the wrapper's layer mapping (view and report alike).

    ``layer_ids=``/``start_layer=`` or the sub-pool's own ``model_layer_ids`` must agree with it.
    """
    if structure.layer_ids is None:
        return view
    mapped, name = list(structure.layer_ids), type(pool).__name__
    if len(mapped) != len(view.layer_ids):
        raise InconsistentLayersError(
            f"{name}: its layer mapping names {len(mapped)} attention layers "
            f"{mapped} but {structure.primary_attr} holds {len(view.layer_ids)}"
        )
    explicit = sorted({"layer_ids", "start_layer"} & options)
    if not compact_default(structure.primary, len(mapped)):
        explicit.append(f"{structure.primary_attr}.model_layer_ids")
    if explicit and view.layer_ids != mapped:
        raise InconsistentLayersError(
            f"{name}: {', '.join(explicit)} give layers {view.layer_ids} but the wrapper's layer mapping puts "
            f"{structure.primary_attr}'s layers at {mapped}; drop the option or fix the mapping"
        )
    return view.rebuild(layer_ids=mapped, report=replace(view.report, layer_ids=tuple(mapped)))


def named_sub_pool_ids(pool: object, attrs: Sequence[str], view: PoolView, options: set[str]) -> PoolView:
    """Explicit attrs into one sub-pool of a hybrid wrapper: its layers' ids come from the wrapper's mapping."""
    owners = {a.rpartition(".")[0] for a in attrs}
    owner = owners.pop() if len(owners) == 1 else ""
    structure = detect(pool) if owner in ("full_kv_pool", "swa_kv_pool", "main_pool") else None
    ids = tuple(g for g, attr, _ in structure.backing if attr == owner) if structure else ()
    if structure is None or not ids:
        return view
    sub = replace(structure, primary_attr=owner, primary=probe(pool, owner), layer_ids=ids)
    check_wrapper_page_size(pool, sub)  # the same rule as for the unwrapped wrapper (readers.sources.locate_source)
    return mapped_layer_ids(pool, sub, view, options)
