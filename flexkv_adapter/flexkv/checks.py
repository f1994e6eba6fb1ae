"""Checks of a plan against how FlexKV's workers will address it (flexkv_consumers.md §2-3)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

from ..errors import AdapterError, NotAddressableError, PlanError, describe
from ..gate import Group, admit
from ..model.copy_rules import ALIGNMENT_FIX, WORD, alignment_problem, shard_problem
from .plan_types import AddressingMode, memory_of

if TYPE_CHECKING:
    from .plan_types import FlexKVPlan

logger = logging.getLogger(__name__)
SHARED_KV_MODES = ("sharded", "all_write", "rank0_only", "layer_parallel", "rank_rotate")


def shared_kv_mode() -> str:
    """FlexKV's ``FLEXKV_KV_SHARED_ACROSS_RANKS_MODE``; an unknown value falls back to sharded, as in FlexKV."""
    mode = os.environ.get("FLEXKV_KV_SHARED_ACROSS_RANKS_MODE", "sharded")
    return mode if mode in SHARED_KV_MODES else "sharded"


def flexkv_stride_probe(t: torch.Tensor, tokens_per_block: int) -> tuple[int, int] | None:
    """(kv, block) strides in bytes that FlexKV's ``_get_gpu_strides_from_tensor`` finds, or None.

    It takes the first of the three leading axes of size 2 as K/V, the first other axis of size
    ``tokens_per_block`` as tokens, and the remaining one as blocks; None makes it fall back to
    the layout's strides.
    """
    if t.ndim != 5:
        return None
    sizes = list(t.shape[:3])
    kv = next((i for i in range(3) if sizes[i] == 2), None)
    tokens = next((i for i in range(3) if i != kv and sizes[i] == tokens_per_block), None)
    block = next((i for i in range(3) if i not in (kv, tokens)), None)
    if kv is None or block is None:
        return None
    return t.stride(kv) * t.element_size(), t.stride(block) * t.element_size()


def admit_plan(p: FlexKVPlan, source: str) -> None:
    """The gate on what a plan registers, in FlexKV's call shape for its mode: SGLANG all K then all V (two a
    layer), VLLM one a layer, TRTLLM (BLOCKFIRST) one for every layer. One tensor under two layer names (KV
    sharing) is accepted with one INFO line a plan (the vLLM plugin plans at every registration and wake)."""
    per_layer = 2 if p.mode is AddressingMode.SGLANG else 1
    ids = None if p.mode is AddressingMode.TRTLLM else tuple(p.layer_ids)
    if warnings := admit(source, [Group("KV", tuple(p.tensors), ids, per_layer)]):
        logger.info("%s: one tensor under several layer names (KV sharing): %s", source, "; ".join(warnings))


def readmit(p: FlexKVPlan) -> None:
    """Send only what the gate admitted: ``p``'s tensors must be the memory plan() sealed into it after the gate
    (a plan built by hand, tensors swapped through ``dataclasses.replace``, a storage freed or resized since are
    not), so the gate's verdict still holds and is not asked again."""
    where = f"register({p})"
    if not p.admitted:
        raise AdapterError(
            f"{where}: this FlexKVPlan was not made by plan(), so no gate admitted its tensors; plan() it"
        )
    if (now := memory_of(p)) != p.admitted:
        changed = [i for i, (a, b) in enumerate(zip(now, p.admitted)) if a != b]
        which = f"tensor(s) {changed}" if changed else f"{len(now)} tensors for {len(p.admitted)} admitted"
        raise NotAddressableError(
            f"{where}: {which} are not the memory plan() admitted (address, shape, strides, dtype or "
            f"storage size changed since); FlexKV would copy blocks the plan never checked. Plan again"
        )


def check_five_d(p: FlexKVPlan, source: str) -> None:
    """5-D per-layer tensors: FlexKV's probe and its layout-stride workers must agree."""
    if p.tensors[0].ndim != 5:
        return
    if p.num_block == 2:
        raise NotAddressableError(
            f"{source}: a 5-D cache with num_blocks == 2 is read by FlexKV's first-axis-of-size-2 probe (and its "
            f"vLLM adapter's shape guess) as the K/V axis; allocate more blocks or adapt() it into per-layer views"
        )
    _, block_stride, kv_stride = p.strides()
    for layer, t in enumerate(p.tensors):
        probed = flexkv_stride_probe(t, p.tokens_per_block)
        if probed is not None and (probed[0] != kv_stride or (p.num_block > 1 and probed[1] != block_stride)):
            raise NotAddressableError(
                f"{source}: layer {layer} ({describe(t)}): FlexKV's stride probe (first leading axis of size 2 = "
                f"K/V) finds kv/block strides {probed} B, but the {p.type.value} layout means "
                f"{(kv_stride, block_stride)} B; FlexKV's layerwise and NIXL workers use the latter, so one of "
                f"them would misread the cache"
            )


def check_chunks(p: FlexKVPlan, chunks: dict[int, list[torch.Tensor]], source: str, tp_size: int) -> None:
    """Every (layer, kv): FlexKV's block-b address is the source's block b, its chunk contiguous and aligned."""
    layer_stride, block_stride, kv_stride = p.strides()
    for stride, name in ((layer_stride, "layer"), (block_stride, "block"), (kv_stride, "kv")):
        if stride % WORD:
            raise NotAddressableError(f"{source}: FlexKV {name} stride {stride} B is not a multiple of 8 bytes")
    if p.num_kv_heads == 1 and shared_kv_mode() == "sharded" and (problem := shard_problem(p.chunk_bytes, tp_size)):
        raise NotAddressableError(f"{source}: {problem}")
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
            if problem := alignment_problem(p.chunk_bytes, c.data_ptr()):
                raise NotAddressableError(f"{where}: {problem}. {ALIGNMENT_FIX}")
            itemsize = c.element_size()
            actual = (c.data_ptr(), c.stride(0) * itemsize if p.num_block > 1 else block_stride)
            expected = (p.address(layer, kv, 0), block_stride)
            if actual != expected:
                raise NotAddressableError(
                    f"{where}: FlexKV {p.mode.value} mode would read block 0 at {expected[0]:#x} and step "
                    f"{expected[1]} B per block, but the source keeps it at {actual[0]:#x} stepping "
                    f"{actual[1]} B; registering this layout would corrupt the cache"
                )
