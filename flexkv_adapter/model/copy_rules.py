"""Alignment FlexKV's copy kernels need from every registered chunk (flexkv_consumers.md §2).

They work in 8-byte words and truncate: a chunk that is not a multiple of 8 bytes loses its tail.
The default kernel switches to 16-byte vector loads whenever the chunk is a multiple of 16 bytes,
without looking at the GPU base pointer: a base that is 8- but not 16-aligned then raises a sticky
misaligned-address CUDA error that kills the worker. Shared KV (``num_kv_heads=1``) with tp > 1 in
FlexKV's default ``sharded`` mode has each rank copy chunk/tp bytes, truncated to 8-byte words too.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

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
