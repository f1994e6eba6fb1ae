"""Derive FlexKV's ``KVCacheLayout`` fields and tensor order for a view or raw KV tensors.

FlexKV picks its addressing mode from the number of tensors it receives per GPU
(``csrc/tp_transfer_thread_group.cpp``; contract §1.4) and ignores tensor strides, except the kv
and block strides of 5-D per-layer tensors:

=========  =========  ==============================================================
tensors    mode       address of (layer l, kv k, block b)
=========  =========  ==============================================================
2L         SGLANG     ``ptr[k*L + l] + b*block_stride`` (all K, then all V)
L          VLLM       ``ptr[l] + k*kv_stride + b*block_stride`` (MLA: k = 0 only)
1          TRTLLM     ``ptr[0] + b*block_stride + l*layer_stride + k*kv_stride``
=========  =========  ==============================================================

:func:`plan` chooses the mode, computes the strides FlexKV will use, and checks, for every layer
and K/V, that FlexKV's address of block b is where the source keeps block b and that each
block's ``[T, H, D]`` chunk is contiguous. Anything else raises before FlexKV can misread it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod
from typing import Any

import torch
from typing_extensions import Unpack

from ..adapt import _layer_ids, adapt, recognise
from ..axes import format_axes, parse_axes
from ..errors import NotAddressableError, PlanError, describe
from ..options import AdaptOptions, resolve_geometry
from ..views import MHAView, PoolView
from ..vllm_layout import is_vllm_dict

_ALIGN = 8


class LayoutType(str, Enum):
    """FlexKV's ``KVCacheLayoutType`` values."""

    LAYERFIRST = "LAYERFIRST"
    BLOCKFIRST = "BLOCKFIRST"
    LAYERBLOCK = "LAYERBLOCK"


class AddressingMode(str, Enum):
    """FlexKV's GPU backend type, chosen by the number of registered tensors."""

    SGLANG = "SGLANG"  # 2 * num_layer tensors
    VLLM = "VLLM"  # num_layer tensors
    TRTLLM = "TRTLLM"  # one block-first tensor


# Per-layer paged readings registered as they are (FlexKV's vLLM path), and the block-first one.
_REGISTERED_AS_IS = {
    (True, parse_axes("KV P T H D")): (LayoutType.LAYERFIRST, AddressingMode.VLLM),
    (True, parse_axes("P KV T H D")): (LayoutType.LAYERBLOCK, AddressingMode.VLLM),
    (True, parse_axes("P T D")): (LayoutType.LAYERFIRST, AddressingMode.VLLM),
    (True, parse_axes("P T H D")): (LayoutType.LAYERFIRST, AddressingMode.VLLM),
    (False, parse_axes("P L KV T H D")): (LayoutType.BLOCKFIRST, AddressingMode.TRTLLM),
}


@dataclass(frozen=True)
class FlexKVPlan:
    """Everything FlexKV needs to register a pool: layout fields and tensors in its order."""

    type: LayoutType
    mode: AddressingMode
    num_layer: int
    num_block: int
    tokens_per_block: int
    num_head: int
    head_size: int
    kv_dim: int
    num_kv_heads: int
    tensors: tuple[torch.Tensor, ...]
    layer_ids: tuple[int, ...]
    dtype: torch.dtype

    @property
    def kv_shape(self) -> tuple[int, ...]:
        """FlexKV's ``KVCacheLayout.kv_shape`` for this layout (elements)."""
        lay, blk, kv = self.num_layer, self.num_block, self.kv_dim
        tail = (self.tokens_per_block, self.num_head, self.head_size)
        return {
            LayoutType.LAYERFIRST: (lay, kv, blk, *tail),
            LayoutType.BLOCKFIRST: (blk, lay, kv, *tail),
            LayoutType.LAYERBLOCK: (lay, blk, kv, *tail),
        }[self.type]

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one (layer, kv, block) chunk: tokens_per_block * heads * head_size * itemsize."""
        return self.tokens_per_block * self.num_head * self.head_size * self.dtype.itemsize

    def strides(self) -> tuple[int, int, int]:
        """(layer, block, kv) strides in bytes, as FlexKV's worker computes them."""
        shape, item = self.kv_shape, self.dtype.itemsize
        dims = {LayoutType.LAYERFIRST: (1, 3, 2), LayoutType.BLOCKFIRST: (2, 1, 3), LayoutType.LAYERBLOCK: (1, 2, 3)}
        layer, block, kv = (prod(shape[d:]) * item for d in dims[self.type])
        first = self.tensors[0]
        if self.mode is AddressingMode.VLLM and self.kv_dim == 2 and first.ndim == 5:
            # _get_gpu_strides_from_tensor: 5-D kv_dim=2 tensors give kv and block strides themselves.
            kv_axis, block_axis = (0, 1) if self.type is LayoutType.LAYERFIRST else (1, 0)
            layer = first.numel() * item
            block, kv = first.stride(block_axis) * item, first.stride(kv_axis) * item
        return layer, block, kv

    def address(self, layer: int, kv: int, block: int) -> int:
        """The address FlexKV's worker reads for (layer, kv, block): its reference model."""
        layer_stride, block_stride, kv_stride = self.strides()
        if self.mode is AddressingMode.SGLANG:
            return self.tensors[kv * self.num_layer + layer].data_ptr() + block * block_stride
        if self.mode is AddressingMode.VLLM:
            return self.tensors[layer].data_ptr() + kv * kv_stride + block * block_stride
        return self.tensors[0].data_ptr() + block * block_stride + layer * layer_stride + kv * kv_stride

    def layout_fields(self) -> dict[str, Any]:
        """Keyword arguments of FlexKV's ``KVCacheLayout``."""
        return {
            "type": self.type.value,
            "num_layer": self.num_layer,
            "num_block": self.num_block,
            "tokens_per_block": self.tokens_per_block,
            "num_head": self.num_head,
            "head_size": self.head_size,
            "kv_dim": self.kv_dim,
            "num_kv_heads": self.num_kv_heads,
        }

    def to_flexkv(self) -> Any:
        """Build ``flexkv.common.storage.KVCacheLayout`` (needs FlexKV)."""
        from .register import import_flexkv

        storage = import_flexkv("flexkv.common.storage")
        fields = self.layout_fields()
        fields["type"] = storage.KVCacheLayoutType[self.type.value]
        return storage.KVCacheLayout(**fields)

    def __str__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in self.layout_fields().items())
        return f"FlexKV {self.mode.value} mode, {len(self.tensors)} tensors, KVCacheLayout({fields})"


def _num_kv_heads(kind: str, per_rank: int, tp_size: int, total: int | None, replicated: bool) -> int:
    """FlexKV's ``num_kv_heads``: the model's total KV heads; 1 only for MLA (shared across ranks)."""
    if tp_size < 1:
        raise PlanError(f"tp_size must be >= 1, got {tp_size}")
    if kind == "mla":
        return 1
    if total is None:
        return per_rank * tp_size
    if total == per_rank * tp_size:
        return total
    if total < tp_size:
        if not replicated:
            raise PlanError(
                f"total_kv_heads={total} is fewer than tp_size={tp_size}: each rank holds replicated heads. "
                f"Pass replicated_kv_heads=True to register the {per_rank} head(s) per rank x {tp_size} ranks "
                f"(FlexKV stores the duplicates, as its vLLM adapter does)"
            )
        if tp_size % total or per_rank != 1:
            raise PlanError(
                f"replicated heads need tp_size ({tp_size}) to be a multiple of total_kv_heads ({total}) "
                f"and one head per rank (got {per_rank})"
            )
        return per_rank * tp_size
    raise PlanError(
        f"total_kv_heads={total} does not match {per_rank} head(s) per rank x tp_size={tp_size} "
        f"= {per_rank * tp_size}; {'it is not divisible by tp_size' if total % tp_size else 'check tp_size'}"
    )


def _check_chunks(p: FlexKVPlan, chunks: dict[int, list[torch.Tensor]], source: str) -> None:
    """Every (layer, kv): FlexKV's block-b address is the source's block b, chunk contiguous."""
    layer_stride, block_stride, kv_stride = p.strides()
    for stride, name in ((layer_stride, "layer"), (block_stride, "block"), (kv_stride, "kv")):
        if stride % _ALIGN:
            raise NotAddressableError(f"{source}: FlexKV {name} stride {stride} B is not a multiple of 8 bytes")
    for kv, layers in chunks.items():
        for layer, c in enumerate(layers):  # c: [B, T, H, D] view of the source
            where = f"{source}: layer {layer} {'KV'[kv] if p.kv_dim == 2 else 'KV'} ({describe(c)})"
            if c.shape[1:] != (p.tokens_per_block, p.num_head, p.head_size) or c.shape[0] != p.num_block:
                raise PlanError(f"{where} does not match the plan's [B, T, H, D] = {p.kv_shape}")
            if not c[0].is_contiguous():
                raise NotAddressableError(
                    f"{where}: a block's [tokens, heads, dim] chunk is not contiguous; FlexKV copies each "
                    f"chunk as {p.chunk_bytes} consecutive bytes (head-major/HND blocks cannot be registered)"
                )
            if c.data_ptr() % _ALIGN:
                raise NotAddressableError(f"{where}: base address is not 8-byte aligned")
            itemsize = c.element_size()
            actual = (c.data_ptr(), c.stride(0) * itemsize if p.num_block > 1 else block_stride)
            expected = (p.address(layer, kv, 0), block_stride)
            if actual != expected:
                raise NotAddressableError(
                    f"{where}: FlexKV {p.mode.value} mode would read block 0 at {expected[0]:#x} and step "
                    f"{expected[1]} B per block, but the source keeps it at {actual[0]:#x} stepping "
                    f"{actual[1]} B; registering this layout would corrupt the cache"
                )


def plan(
    source: object,
    *,
    tp_size: int = 1,
    total_kv_heads: int | None = None,
    replicated_kv_heads: bool = False,
    model_dtype: torch.dtype | None = None,
    page_size: int | None = None,
    **options: Unpack[AdaptOptions],
) -> FlexKVPlan:
    """Plan FlexKV registration of an adapted view, or of raw KV tensors.

    A :class:`~flexkv_adapter.MHAView` registers 2L tensors (SGLANG mode), an
    :class:`~flexkv_adapter.MLAView` L tensors with ``kv_dim=1`` (VLLM mode). Raw per-layer paged
    tensors (vLLM ``[2, NB, BS, H, D]`` -> LAYERFIRST, ``[NB, 2, BS, H, D]`` -> LAYERBLOCK, MLA
    ``[NB, BS, D]``) register one tensor per layer (VLLM mode); one block-first tensor
    ``[NB, L, 2, BS, H, D]`` registers whole (TRTLLM mode). Any other source goes through
    :func:`~flexkv_adapter.adapt` first.

    ``num_head`` is the heads present per rank; ``num_kv_heads`` the model's total KV heads
    (per-rank heads x ``tp_size``; 1 only for MLA). ``total_kv_heads`` cross-checks it; fewer
    total heads than ``tp_size`` needs ``replicated_kv_heads=True``. ``model_dtype`` (FlexKV's
    model dtype) must have the tensors' element size, since FlexKV sizes blocks with it.

    Raises:
        PlanError: inconsistent TP/head/dtype settings.
        NotAddressableError: FlexKV's address arithmetic would not land on the source's blocks.
    """
    if not isinstance(source, PoolView) and "axes" not in options and is_vllm_dict(source):
        from .vllm_plan import plan_vllm  # imports this module

        kind = options.get("kind")
        return plan_vllm(
            source,  # type: ignore[arg-type]
            kind=kind,
            block_size=page_size,
            tp_size=tp_size,
            total_kv_heads=total_kv_heads,
            replicated_kv_heads=replicated_kv_heads,
            model_dtype=model_dtype,
        )
    if not isinstance(source, PoolView):
        geometry = resolve_geometry(source, page_size, options)
        located, interp, logical = recognise(source, geometry, options)
        key = (interp.per_layer, interp.axes)
        if key not in _REGISTERED_AS_IS or (located.split and interp.per_layer):
            return plan(
                adapt(source, page_size, **options),
                tp_size=tp_size,
                total_kv_heads=total_kv_heads,
                replicated_kv_heads=replicated_kv_heads,
                model_dtype=model_dtype,
            )
        layout_type, mode = _REGISTERED_AS_IS[key]
        tensors = located.containers[0].tensors
        planes = list(logical.values())
        first = planes[0][0]  # [B, T, H, D]
        kind, layer_ids = interp.kind, tuple(_layer_ids(source, located, len(planes[0]), geometry))
        chunks = dict(enumerate(planes))
        name = f"{type(source).__name__}.{'/'.join(located.attrs)} [{format_axes(interp.axes)}]"
    else:
        view = source
        layout_type = LayoutType.LAYERFIRST
        mode = AddressingMode.SGLANG if isinstance(view, MHAView) else AddressingMode.VLLM
        tensors = tuple(view.tensors())
        kind, layer_ids = view.kind, tuple(view.layer_ids)
        if isinstance(view, MHAView):
            k0, v0 = view.k_buffer[0], view.v_buffer[0]
            if k0.shape[2] != v0.shape[2]:
                raise PlanError(
                    f"{view!r}: head_dim {k0.shape[2]} != v_head_dim {v0.shape[2]}; FlexKV takes head_size "
                    f"from the K tensors and uses it for V too, so V would be misread"
                )
        ps = view.page_size
        chunks = {
            kv: [t.view(t.shape[0] // ps, ps, *t.shape[1:]) for t in plane]
            for kv, plane in enumerate(
                [view.k_buffer, view.v_buffer] if isinstance(view, MHAView) else [view.kv_buffer]
            )
        }
        first = chunks[0][0]
        name = repr(view)
    dtype = first.dtype
    if model_dtype is not None and model_dtype.itemsize != dtype.itemsize:
        raise PlanError(
            f"{name}: FlexKV's model dtype {model_dtype} has itemsize {model_dtype.itemsize} but the KV "
            f"tensors hold {dtype} (itemsize {dtype.itemsize}); FlexKV sizes GPU blocks with the model dtype. "
            f"Set FLEXKV_KV_CACHE_DTYPE to a {dtype.itemsize}-byte dtype"
        )
    num_head = first.shape[2]
    result = FlexKVPlan(
        type=layout_type,
        mode=mode,
        num_layer=len(chunks[0]),
        num_block=first.shape[0],
        tokens_per_block=first.shape[1],
        num_head=num_head,
        head_size=first.shape[3],
        kv_dim=2 if kind == "mha" else 1,
        num_kv_heads=_num_kv_heads(kind, num_head, tp_size, total_kv_heads, replicated_kv_heads),
        tensors=tuple(tensors),
        layer_ids=layer_ids,
        dtype=dtype,
    )
    expected_tensors = {
        AddressingMode.SGLANG: 2 * result.num_layer,
        AddressingMode.VLLM: result.num_layer,
        AddressingMode.TRTLLM: 1,
    }[mode]
    if len(result.tensors) != expected_tensors:
        raise PlanError(f"{name}: {mode.value} mode needs {expected_tensors} tensors, got {len(result.tensors)}")
    _check_chunks(result, chunks, name)
    return result
