"""1-D byte buffers: viewed, zero-copy, as the ``shape``/``dtype``/``offset`` the caller declares."""

from __future__ import annotations

from dataclasses import replace
from math import prod

import torch

from ..errors import AdapterError, describe
from ..model.layout import Geometry
from ..readers.containers import Located
from .options import AdaptOptions


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
