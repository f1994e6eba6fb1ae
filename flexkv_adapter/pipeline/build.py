"""The one builder of views: a located reading in, a :class:`~flexkv_adapter.model.views.PoolView` out.

Every source ends here (a pool, a spec or plugin reading, a hybrid's attention sub-pool, a vLLM 0.33
dict), so a rule added here applies to all of them; :data:`RULES` names the rules, in order, for the
tests that prove each one reaches every source.
"""

from __future__ import annotations

import logging

import torch

from ..errors import AdapterError, describe
from ..gate import Group, admit
from ..model.axes import Axis
from ..model.layout import Geometry, Interpretation
from ..model.report import Report
from ..model.views import MHAView, MLAView, PoolView
from ..readers.containers import Located
from ..readers.probe import probe
from ..readers.recognize import reading_text
from .carve import (
    Planes,
    aliased_bytes,
    check_consistent,
    check_flexkv_alignment,
    flat_views,
    reinterpret,
    trim_rows,
)
from .labels import layer_ids_of

logger = logging.getLogger(__name__)

#: The rules :func:`build_view` applies, by the function that applies each.
RULES = (
    "flat_views",
    "check_consistent",
    "check_flexkv_alignment",
    "aliased_bytes",
    "layer_ids_of",
    "admit",
)


def _page_size(pool: object, geometry: Geometry, interp: Interpretation, planes: Planes) -> int:
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
    page_size = _page_size(pool, geometry, interp, logical)
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
