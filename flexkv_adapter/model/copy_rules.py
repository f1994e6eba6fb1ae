"""Alignment FlexKV's copy kernels need from every registered chunk (flexkv_consumers.md §2).

They work in 8-byte words and truncate: a chunk that is not a multiple of 8 bytes loses its tail.
The default kernel switches to 16-byte vector loads whenever the chunk is a multiple of 16 bytes,
without looking at the GPU base pointer: a base that is 8- but not 16-aligned then raises a sticky
misaligned-address CUDA error that kills the worker. Shared KV (``num_kv_heads=1``) with tp > 1 in
FlexKV's default ``sharded`` mode has each rank copy chunk/tp bytes, truncated to 8-byte words too.
And the memory itself must be real (:func:`storage_problem`): FlexKV copies from a pointer, so a meta,
fake, sparse, nested or freed tensor would hand it bytes that are not there.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from itertools import accumulate

import torch

WORD = 8
VECTOR = 16

ALIGNMENT_FIX = (
    "Fix: choose a page size that makes page_size*heads*dim*itemsize a multiple of 8, and allocate the "
    "buffers so every layer starts on a 16-byte boundary (torch's allocator does; an offset into a byte "
    "buffer or a slice may not)."
)


def base_alignment(chunk_bytes: int) -> int:
    """The alignment FlexKV's kernel assumes for a chunk's base address."""
    return VECTOR if chunk_bytes % VECTOR == 0 else WORD


def alignment_problem(chunk_bytes: int, address: int) -> str | None:
    """Why FlexKV would misread or crash on a chunk of ``chunk_bytes`` at ``address``, or None."""
    if chunk_bytes % WORD:
        return f"block bytes {chunk_bytes} are not a multiple of {WORD} (FlexKV copies 8-byte words and drops the rest)"
    need = base_alignment(chunk_bytes)
    if address % need:
        return (
            f"base address {address:#x} is not {need}-byte aligned (address % {need} = {address % need}); "
            f"with block bytes {chunk_bytes} a multiple of {need}, FlexKV's kernel uses {need}-byte loads and "
            f"the worker dies with a misaligned-address CUDA error"
        )
    return None


def shard_problem(chunk_bytes: int, tp_size: int) -> str | None:
    """Why FlexKV's sharded D2H of shared KV (num_kv_heads=1) across ``tp_size`` ranks loses bytes, or None."""
    if tp_size > 1 and chunk_bytes % (WORD * tp_size):
        return (
            f"shared KV (num_kv_heads=1) with tp_size={tp_size}: FlexKV's default sharded mode "
            f"(FLEXKV_KV_SHARED_ACROSS_RANKS_MODE=sharded) has each rank copy {chunk_bytes}/{tp_size} bytes "
            f"in 8-byte words, so block bytes must be a multiple of {WORD * tp_size}; the shards would be "
            f"truncated silently. Fix: another page size, or FLEXKV_KV_SHARED_ACROSS_RANKS_MODE=rank0_only"
        )
    return None


def packing_problem(groups: Sequence[tuple[str, int, int]], kv_dim: int) -> str | None:
    """Why FlexKV's CPU block of these layer groups ``(name, layers, chunk bytes)`` misaligns, or None.

    FlexKV packs a CPU block group after group, [layer][kv][chunk] each, per rank (ranks follow at this
    stride, ``_init_tp_multi_group``); 16-byte chunks get 16-byte loads there too. It needs no tp, so
    adapt() and plan() ask it alike.
    """
    sizes = [layers * kv_dim * chunk for _, layers, chunk in groups]
    block = sum(sizes)
    for (name, _, chunk), offset in zip(groups, accumulate([0, *sizes])):
        if chunk % VECTOR == 0 and (offset % VECTOR or block % VECTOR):
            return (
                f"FlexKV packs each CPU block group after group ({sizes} bytes, {block} per rank); group {name} has "
                f"{chunk}-byte chunks, which its kernel copies with {VECTOR}-byte loads, but starts at byte "
                f"{offset} of a {block}-byte block, so its copies fault with a misaligned address. Fix: a page size "
                f"that makes every group's bytes per block a multiple of {VECTOR}"
            )
    return None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def storage_problem(t: torch.Tensor) -> str | None:
    """Why ``t`` has no real memory FlexKV could copy (meta, fake, sparse, empty), or None if it has."""
    plain = type(t) in _PLAIN
    if plain and not t.is_meta and not t.is_nested and t.layout is torch.strided:
        n = t.numel()  # the common case: a dense, contiguous tensor inside the memory behind it
        if n and t.is_contiguous() and (t.storage_offset() + n) * t.element_size() <= t.untyped_storage().nbytes():
            return None
    if t.is_nested:  # strided nested tensors have no sizes: .shape raises
        return "is a nested tensor; FlexKV copies dense tensors of one shape"
    if t.layout is not torch.strided:
        return f"is a {str(t.layout).removeprefix('torch.')} tensor; FlexKV copies dense (strided) memory"
    if t.is_meta:
        return "is on the meta device: it has a shape but no memory"
    if t.numel() == 0:
        return f"is empty (shape {tuple(t.shape)})"
    try:  # subclasses (FakeTensor, functional wrappers) may warn or raise when asked for memory
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            address = t.untyped_storage().data_ptr()
    except Exception as exc:
        return f"has no accessible storage ({type(exc).__name__}: {str(exc)[:120]})"
    if address == 0 and t.untyped_storage().nbytes():
        return f"has no memory behind it (a {type(t).__name__} without storage, e.g. a FakeTensor)"
    return _extent_problem(t)


def _extent_problem(t: torch.Tensor) -> str | None:
    """Why the view reaches past its storage (resized or freed after the view was made), or None."""
    try:
        nbytes, item, offset = t.untyped_storage().nbytes(), t.element_size(), t.storage_offset()
        if t.is_contiguous():
            need = (offset + t.numel()) * item  # the common case, without walking shape and strides
        else:
            need = (offset + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)) * item
    except Exception as exc:
        return f"has no accessible storage ({type(exc).__name__}: {str(exc)[:120]})"
    if need > nbytes:
        return (
            f"reaches byte {need} but its storage holds {nbytes} bytes: the storage was resized or freed after "
            f"the view was made"
        )
    return None
