"""Carve per-layer views out of located tensors: the only module that builds tensors.

Every tensor is made with ``select``/``unsqueeze``/``permute``/``view``/slicing, so nothing here
allocates KV memory. Carving runs in two stages:

* :func:`logical_views` gives, per plane and layer, a view whose dims are in canonical order
  (rows axes, heads, dim). It exists for every reading, addressable or not, which lets
  :func:`signature` tell two readings apart by the bytes they address.
* :func:`flat_views` turns them into ``[rows, heads, dim]`` tensors FlexKV can address. FlexKV
  ignores strides (block b is read at ``data_ptr + b * block_bytes``), so each one must be
  C-contiguous; otherwise :class:`NotAddressableError` says which axis breaks it and why.

A 1-D byte buffer is first viewed as the ``shape``/``dtype``/``offset`` its caller declares
(:func:`apply_declared_shape`), zero-copy like every other view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from math import prod

import torch

from ..errors import AdapterError, InconsistentLayersError, NotAddressableError, describe
from ..model.axes import Axis, format_axes
from ..model.copy_rules import ALIGNMENT_FIX, WORD, alignment_problem, base_alignment
from ..model.layout import Geometry, Interpretation, Plane
from ..readers.containers import Located
from ..readers.options import AdaptOptions
from ..readers.recognize import plane_sources

Planes = dict[Plane, list[torch.Tensor]]


def apply_declared_shape(located: Located, geometry: Geometry, options: AdaptOptions, pool: object) -> Located:
    """View a 1-D byte buffer as its declared ``shape``/``dtype`` (zero-copy)."""
    containers = []
    for c in located.containers:
        t = c.tensors[0]
        if c.is_sequence or t.ndim != 1:
            containers.append(c)
            continue
        shape, dtype = options.get("shape"), geometry.dtype
        if shape is None or dtype is None or t.ndim != 1:
            raise AdapterError(
                f"{type(pool).__name__}.{c.attr} is a 1-D buffer ({describe(t)}); declare its geometry "
                f"with shape=(...), dtype=torch.<type> and axes='...' (offset= in bytes if it does not start at 0)"
            )
        shaped = _shape_bytes(t, tuple(shape), dtype, options.get("offset", 0))
        containers.append(replace(c, tensors=(shaped,)))
        located = replace(located, family="byte-buffer")
    return replace(located, containers=tuple(containers))


def _shape_bytes(buf: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, offset: int) -> torch.Tensor:
    """``shape`` and ``offset`` were validated at the boundary (positive sizes, one -1, offset >= 0)."""
    if not buf.is_contiguous():
        raise AdapterError(f"a byte buffer must be contiguous, got {describe(buf)}")
    itemsize, nbytes = dtype.itemsize, buf.numel() * buf.element_size()
    start = buf.storage_offset() * buf.element_size() + offset  # bytes from the storage's start
    if start % itemsize:  # what a zero-copy .view(dtype) of the bytes needs
        raise AdapterError(
            f"offset={offset} puts the {dtype} data at byte {start} of its storage, not a multiple of its "
            f"itemsize {itemsize} ({describe(buf)}); use an offset that aligns it"
        )
    known = prod(s for s in shape if s != -1)
    if -1 in shape:
        shape = tuple(max(nbytes - offset, 0) // itemsize // known if s == -1 else s for s in shape)
    need = prod(shape) * itemsize
    if need == 0 or offset + need > nbytes:
        raise AdapterError(
            f"declared shape={shape} of {dtype} from offset {offset} needs {need} bytes but the buffer "
            f"has {nbytes} ({describe(buf)})"
        )
    return buf.view(torch.uint8)[offset : offset + need].view(dtype).view(shape)


def _canonical_order(axes: Sequence[Axis]) -> list[Axis]:
    rows = [Axis.ROWS] if Axis.ROWS in axes else [Axis.PAGE, Axis.TOKEN]
    return [*rows, Axis.HEAD, Axis.DIM]


def _layer_recipe(axes: Sequence[Axis], per_layer: bool, kv: int | None) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """Build, once per plane, the view ops that take one layer to canonical axis order."""
    rest = list(axes)
    layer_dim = None if per_layer else rest.index(Axis.LAYER)
    if layer_dim is not None:
        rest.remove(Axis.LAYER)
    kv_dim = None if kv is None else rest.index(Axis.KV)
    if kv_dim is not None:
        rest.remove(Axis.KV)
    unsqueeze = Axis.HEAD not in rest
    if unsqueeze:
        rest.append(Axis.HEAD)
    perm = [rest.index(a) for a in _canonical_order(axes)]
    identity = perm == sorted(perm)

    def layer_view(t: torch.Tensor, layer: int) -> torch.Tensor:
        if layer_dim is not None:
            t = t.select(layer_dim, layer)
        if kv_dim is not None:
            t = t.select(kv_dim, kv)  # type: ignore[arg-type]
        if unsqueeze:
            t = t.unsqueeze(t.ndim)
        return t if identity else t.permute(perm)

    return layer_view


def logical_views(located: Located, interp: Interpretation) -> Planes:
    """Per plane, one canonical-order view per layer (may be non-contiguous)."""
    planes: Planes = {}
    for plane, container, kv in plane_sources(located, interp):
        view = _layer_recipe(interp.axes, interp.per_layer, kv)
        if interp.per_layer:
            planes[plane] = [view(t, 0) for t in container.tensors]
        else:
            t = container.tensors[0]
            planes[plane] = [view(t, layer) for layer in range(t.shape[interp.axes.index(Axis.LAYER)])]
    return planes


def _address_map(t: torch.Tensor) -> tuple[object, ...]:
    """Canonical (size, stride) runs: equal maps address the same bytes in the same order."""
    runs: list[list[int]] = []
    for size, stride in zip(t.shape, t.stride()):
        if size == 1:
            continue
        if runs and runs[-1][1] == size * stride:
            runs[-1] = [runs[-1][0] * size, stride]
        else:
            runs.append([size, stride])
    return (t.data_ptr(), t.element_size(), tuple(map(tuple, runs)))


def rows_heads_dim(t: torch.Tensor) -> tuple[int, int, int]:
    shape = t.shape
    return (shape[0] * shape[1] if len(shape) == 4 else shape[0]), shape[-2], shape[-1]


def signature(planes: Planes) -> tuple[object, ...]:
    """What a reading means, independent of how its axes were named."""
    return tuple((plane, rows_heads_dim(t), _address_map(t)) for plane, views in sorted(planes.items()) for t in views)


def _why_not_tight(axes: Sequence[Axis]) -> str:
    rows_first = axes.index(Axis.ROWS if Axis.ROWS in axes else Axis.PAGE)
    rows_last = axes.index(Axis.ROWS if Axis.ROWS in axes else Axis.TOKEN)
    if Axis.HEAD in axes and axes.index(Axis.HEAD) < rows_last:
        return "heads sit outside tokens (head-major/HND), so one token's heads are not adjacent"
    for axis, name in ((Axis.LAYER, "layer"), (Axis.KV, "K/V")):
        if axis in axes and axes.index(axis) > rows_first:
            unit = "pages" if Axis.PAGE in axes else "tokens"
            return f"the {name} axis lies between consecutive {unit}, so one layer's rows are interleaved"
    return "its strides are not tight (padding or a non-contiguous source)"


def flat_views(planes: Planes, interp: Interpretation, pool: object, attrs: Sequence[str]) -> Planes:
    """``[rows, heads, dim]`` C-contiguous views, or :class:`NotAddressableError`."""
    flat: Planes = {}
    for plane, views in planes.items():
        out = []
        for layer, t in enumerate(views):
            if not t.is_contiguous():
                tight = [1] * t.ndim
                for d in range(t.ndim - 2, -1, -1):
                    tight[d] = tight[d + 1] * t.shape[d + 1]
                raise NotAddressableError(
                    f"{type(pool).__name__}.{'/'.join(attrs)} read as {interp} gives layer {layer} "
                    f"{plane.upper()} a view with {describe(t)} "
                    f"(canonical {format_axes(_canonical_order(interp.axes))}),"
                    f" which is not C-contiguous: {_why_not_tight(interp.axes)}. A tight layout needs "
                    f"strides {tuple(tight)}. FlexKV ignores strides and reads block b at "
                    f"data_ptr + b * block_bytes, so it would read the wrong bytes. Fix: keep the engine "
                    f"layout layer-separate and token-major (NHD), or register the tensor per layer with "
                    f"its own FlexKV layout instead of flat K/V."
                )
            out.append(t if t.ndim == 3 else t.view(rows_heads_dim(t)))
        flat[plane] = out
    return flat


def reinterpret(planes: Planes, dtype: torch.dtype) -> Planes:
    """Reinterpret the bytes as ``dtype`` (e.g. uint8 storage of fp8), still zero-copy."""
    return {plane: [t.view(dtype) for t in views] for plane, views in planes.items()}


def check_consistent(planes: Planes, pool: object, attrs: Sequence[str]) -> None:
    """All layers of a plane agree; K and V agree on rows, heads, dtype and device."""
    name = f"{type(pool).__name__}.{'/'.join(attrs)}"
    ref = next(iter(planes.values()))[0]
    for plane, views in planes.items():
        first = views[0]
        for layer, t in enumerate(views):
            if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
                raise InconsistentLayersError(
                    f"{name}: layer {layer} {plane.upper()} has {describe(t)} but layer 0 has "
                    f"{describe(first)}. Every layer must share shape, dtype and device; adapt "
                    f"heterogeneous groups separately."
                )
        if first.shape[:2] != ref.shape[:2] or first.dtype != ref.dtype or first.device != ref.device:
            raise InconsistentLayersError(
                f"{name}: {plane.upper()} has {describe(first)} but K has {describe(ref)}; K and V "
                f"must agree on rows, heads, dtype and device (only the head dim may differ)."
            )


def check_flexkv_alignment(planes: Planes, page_size: int, pool: object, attrs: Sequence[str]) -> None:
    """Block bytes and base addresses FlexKV's copy kernels can use (:mod:`.copy_rules`)."""
    for plane, views in planes.items():
        first = views[0]  # check_consistent: every layer of a plane has its shape and dtype
        block_bytes = page_size * first.shape[1] * first.shape[2] * first.element_size()
        need = base_alignment(block_bytes) if block_bytes % WORD == 0 else 1
        for layer, t in enumerate(views):
            if block_bytes % WORD == 0 and t.data_ptr() % need == 0:
                continue  # the common case, without building a message
            problem = alignment_problem(block_bytes, t.data_ptr())
            if problem:
                raise NotAddressableError(
                    f"{type(pool).__name__}.{'/'.join(attrs)}: layer {layer} {plane.upper()} has "
                    f"{describe(t)}: {problem}. {ALIGNMENT_FIX}"
                )


def aliased_bytes(planes: Planes, sources: Sequence[torch.Tensor]) -> tuple[int, int]:
    """(bytes aliased, bytes not inside any source storage) over all exposed tensors."""
    spans: dict[object, int] = {s.untyped_storage().data_ptr(): s.untyped_storage().nbytes() for s in sources}
    aliased = copied = 0
    for views in planes.values():
        for t in views:  # a view's storage starts storage_offset elements before its data
            start, item, nbytes = t.data_ptr(), t.element_size(), t.numel() * t.element_size()
            base = start - t.storage_offset() * item
            size = spans.get(base)
            if size is not None and base <= start and start + nbytes <= base + size:
                aliased += nbytes
            else:
                copied += nbytes
    return aliased, copied


def trim_rows(planes: Planes, rows: int) -> Planes:
    """Keep the first ``rows`` rows of every view (a slice: contiguous, zero-copy)."""
    return {plane: [t[:rows] for t in views] for plane, views in planes.items()}
