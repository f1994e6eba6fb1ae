"""The one builder of views: a located reading in, a labelled :class:`~flexkv_adapter.model.views.PoolView` out.

Every source ends here (a pool, a spec or plugin reading, a hybrid's attention sub-pool, a vLLM 0.33
dict), so a rule added here applies to all of them; :data:`RULES` names the rules, in order, for the
tests that prove each one reaches every source.

The layers' global ids come from the pool's metadata (:func:`~.metadata.layer_ids_of`). The view then takes
the hybrid policy (:func:`apply_policy`): what a pool keeps beside its KV is offloaded whole as FlexKV layer
groups when its planes share the KV's page ids, and otherwise refused by name (:class:`HybridPoolError`) unless
``hybrid="attention_only"``; :func:`~flexkv_adapter.adapt` and :func:`~flexkv_adapter.flexkv.plan` both reach
that one decision here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import torch

from ..errors import AdapterError, UnsupportedPoolError, describe
from ..gate import Group, admit
from ..model.axes import Axis
from ..model.hybrid import HybridMode, HybridPoolError, PartialPoolError, SideGroup, WholePool
from ..model.layout import Geometry, Interpretation
from ..model.report import Report
from ..model.views import MHAView, MLAView, PoolView
from ..readers import planes as pool_planes
from ..readers.containers import Located, probe
from ..readers.recognize import reading_text
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
from .metadata import layer_ids_of

logger = logging.getLogger(__name__)
# The policy's messages keep the logger name they have always had: demo --json shows it, a logging setup may name it.
policy_logger = logging.getLogger("flexkv_adapter.hybrid.policy")

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


def resolve_mode(mode: str | None) -> HybridMode:
    if mode is None:
        from ..config.settings import load_settings

        return load_settings().hybrid
    if mode not in ("error", "attention_only"):
        raise UnsupportedPoolError(f"hybrid must be 'error' or 'attention_only', got {short_repr(mode)}")
    return mode  # type: ignore[return-value]


def apply_policy(view: PoolView, pool: object, family: str, groups: Sequence[SideGroup], mode: str | None) -> PoolView:
    """Offload whole what FlexKV's layer groups can address; otherwise refuse (default) or go attention-only."""
    try:
        whole = pool_planes.describe(pool, view, admit)
    except PartialPoolError as exc:
        if not groups or resolve_mode(mode) != "attention_only":
            raise HybridPoolError(str(exc)) from exc
        whole = None  # a refused row: attention_only keeps its meaning
    covered = {t.data_ptr() for p in whole.planes for t in p.tensors} if whole is not None else set()
    if whole is not None and all(g.tensors and {t.data_ptr() for t in g.tensors} <= covered for g in groups):
        return _offload_whole(view, pool, whole, bool(groups), mode)
    if not groups:
        return view
    excluded = tuple((lid, f"{g.name}: {g.reason}") for g in groups for lid in g.layer_ids)
    described = "; ".join(g.describe() for g in groups)
    left_out = sorted({lid for g in groups for lid in g.layer_ids})
    name = type(pool).__name__
    if resolve_mode(mode) != "attention_only":
        raise HybridPoolError(
            f"{name} is a hybrid pool ({family}): FlexKV would receive only the attention layers "
            f"{list(view.layer_ids)}. Not offloaded: {described}. Layers {left_out} would be restored without "
            f"that state, so a prefix hit would compute on missing or stale data. To offload the attention "
            f"layers anyway, pass adapt(pool, hybrid='attention_only') or set FLEXKV_ADAPTER_HYBRID=attention_only."
        )
    policy_logger.warning(
        "%s (%s): offloading attention layers %s only; not offloaded: %s", name, family, list(view.layer_ids), described
    )
    report = replace(
        view.report,
        source_kind=name,
        recognizer=f"{family}/{view.report.recognizer}",
        excluded_layers=excluded,
        side_groups=tuple(g.describe() for g in groups),
        warnings=(*view.report.warnings, f"attention layers only: {len(groups)} side group(s) not offloaded"),
    )
    return view.rebuild(source=pool, side_groups=tuple(groups), report=report)


def _offload_whole(view: PoolView, pool: object, whole: WholePool, listed: bool, mode: str | None) -> PoolView:
    """The only exact choice for these pools; ``hybrid=`` may only refuse it, naming why."""
    name, what = type(pool).__name__, ", ".join(p.name for p in whole.planes)
    if mode == "attention_only":
        raise HybridPoolError(
            f"{name} can be offloaded whole: {what} share the KV's page ids and register as FlexKV layer groups "
            f"(plan(view).flexkv_layer_groups()). hybrid='attention_only' would register the KV alone, and a "
            f"prefix hit would restore it without them. Drop hybrid= (offloading whole is the default)"
        )
    if mode == "error" and listed:  # asked for the KV alone (a caller that registers only the KV buffers)
        raise HybridPoolError(
            f"{name} ({whole.family}) keeps {what} beside its KV; hybrid='error' asks for the KV alone, which "
            f"would restore prefixes without them. Drop hybrid= to offload it whole through FlexKV's layer groups"
        )
    # the group rules (no tp), also for hybrid="error": a connector that reads the planes from the pool itself
    # (SGLang's, for DSA) registers exactly these groups, so they must be what FlexKV can address
    admit(repr(view), whole.groups(view), blocks=view.num_blocks, page=view.page_size)
    if mode == "error":  # DSA: FlexKV's connectors read the indexer from the pool themselves
        return _kv_alone(view, what)
    policy_logger.info("%s: %s", name, whole.describe())
    report = replace(view.report, source_kind=name, notes=(*view.report.notes, whole.describe()))
    return view.rebuild(source=pool, whole=whole, report=report)


def _kv_alone(view: PoolView, left_out: str) -> PoolView:
    """hybrid="error" on a pool with planes: the KV alone, for a connector that reads the rest itself. Its
    report says so; plan() and register() refuse it (:func:`~flexkv_adapter.flexkv.groups.check_not_partial`)."""
    note = (
        f"hybrid='error': the KV alone; not included: {left_out}. FlexKV's SGLang connector reads that from the "
        f"pool itself; plan() and register() refuse this view"
    )
    return view.rebuild(report=replace(view.report, notes=(*view.report.notes, note)))
