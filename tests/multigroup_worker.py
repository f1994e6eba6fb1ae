"""A stand-in for FlexKV's GPU<->CPU transfer worker with layer groups, written from FlexKV 34ab141.

What it follows (read, not copied):

* ``KVTPClient.register_to_server`` (server/client.py:366-380): its signature; the CUDA check is
  left out (tests run on CPU). :class:`Client` records each call.
* ``GPUCPUTransferWorker.__init__`` / ``_init_multi_group`` (transfer/worker.py:740-890): the
  layer groups come from the server's ``ModelConfig`` (transfer_engine.py:254-299), not the
  request; ``kv_dim`` and ``num_kv_heads`` from the primary layout; the backend type from group 0
  (1 tensor: TRT-LLM, L: vLLM, 2L: SGLang, else ``ValueError``); per group, the chunk from its
  spec (``tokens_per_block // compress_ratio * num_kv_heads * head_size * dtype``), GPU strides
  from a 5-D tensor's probe when ``kv_dim`` is 2, else from the group's layout; layer pointers
  ``t[0].data_ptr()`` (so a 0-row tensor raises); a BLOCKFIRST CPU block of
  ``sum(groups' bytes) * tp_size`` bytes, groups packed in order, each [layer][kv][chunk].
* The copy kernel (csrc/gtensor_handler.cuh, transfer.cu): strides and chunks in 8-byte words by
  integer division; SGLang ``ptr[kv * L + l] + b * block_stride``, vLLM ``ptr[l] + kv * kv_stride
  + b * block_stride``, TRT-LLM ``ptr[0] + b * block_stride + l * layer_stride + kv * kv_stride``.

Every access is resolved to a registered tensor's storage and must stay inside it: an overrun
raises instead of corrupting this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch

from tests.flexkv_cpu.kernel import window

WORD = 8


@dataclass
class Client:
    """``KVTPClient.register_to_server`` as FlexKV's worker receives it."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def register_to_server(
        self,
        kv_caches: list[torch.Tensor],
        kv_layout: Any,
        override_device_id: int | None = None,
        layer_groups: list[Any] | None = None,
        gpu_layouts: list[Any] | None = None,
        handles_per_group: list[list[torch.Tensor]] | None = None,
        swa_caches: list[torch.Tensor] | None = None,
        swa_layout: Any = None,
        swa_layer_groups: list[Any] | None = None,
        swa_gpu_layouts: list[Any] | None = None,
        swa_handles_per_group: list[list[torch.Tensor]] | None = None,
        resume: bool = False,
    ) -> None:
        if not kv_caches:
            raise ValueError("GPU blocks must be CUDA tensors")
        self.calls.append(
            dict(
                kv_caches=list(kv_caches),
                kv_layout=kv_layout,
                layer_groups=layer_groups,
                gpu_layouts=gpu_layouts,
                handles_per_group=handles_per_group,
            )
        )


def _kv_shape(layout: Any) -> tuple[int, ...]:
    tail = (layout.tokens_per_block, layout.num_head, layout.head_size)
    lay, blk, kv = layout.num_layer, layout.num_block, layout.kv_dim
    return {
        "LAYERFIRST": (lay, kv, blk, *tail),
        "BLOCKFIRST": (blk, lay, kv, *tail),
        "LAYERBLOCK": (lay, blk, kv, *tail),
    }[layout.type.value]


def _layout_strides(layout: Any) -> tuple[int, int, int]:
    """(kv, block, layer) strides in elements, as KVCacheLayout.get_*_stride computes them."""
    shape = _kv_shape(layout)
    kv, block, layer = {"LAYERFIRST": (2, 3, 1), "BLOCKFIRST": (3, 1, 2), "LAYERBLOCK": (3, 2, 1)}[layout.type.value]
    return prod(shape[kv:]), prod(shape[block:]), prod(shape[layer:])


def _probe(t: torch.Tensor, tokens_per_block: int, item: int, kv_dim: int) -> tuple[int, int, int] | None:
    """``_get_gpu_strides_from_tensor``: 5-D tensors with kv_dim 2 only."""
    if kv_dim == 1 or t.ndim != 5:
        return None
    sizes = list(t.shape[:3])
    kv = next((i for i in range(3) if sizes[i] == 2), None)
    tokens = next((i for i in range(3) if i != kv and sizes[i] == tokens_per_block), None)
    block = next((i for i in range(3) if i not in (kv, tokens)), None)
    if kv is None or block is None:
        return None
    return t.stride(kv) * item, t.stride(block) * item, t.numel() * item


@dataclass
class _Group:
    tensors: list[torch.Tensor]
    ptrs: list[int]
    chunk: int
    gpu_kv: int
    gpu_block: int
    gpu_layer: int
    cpu_layer: int
    cpu_kv: int
    cpu_offset: int
    num_layers: int


class Worker:
    """GPU<->CPU copies of one registration, with ``layer_groups`` taken from the server's ModelConfig."""

    def __init__(self, call: dict[str, Any], model_layer_groups: list[Any] | None, num_cpu_blocks: int, tp: int = 1):
        layout = call["kv_layout"]
        self.kv_dim, self.num_kv_heads = layout.kv_dim, layout.num_kv_heads
        self.registered = call["kv_caches"]
        per_group, layouts = call["handles_per_group"], call["gpu_layouts"]
        if model_layer_groups is not None and per_group is not None and layouts is not None:
            self.groups = self._multi_group(model_layer_groups, per_group, layouts, layout, num_cpu_blocks, tp)
            ref_len, ref_layers = len(per_group[0]), model_layer_groups[0].num_layers
        else:
            raise NotImplementedError("the uniform path is covered by tests/helpers.flexkv_worker_read")
        if ref_len == 1:
            self.block_type = "TRTLLM"
        elif ref_len == ref_layers:
            self.block_type = "VLLM"
        elif ref_len == 2 * ref_layers:
            self.block_type = "SGLANG"
        else:
            raise ValueError(f"Invalid GPU block type: ref_blocks_len={ref_len}, ref_num_layers={ref_layers}")

    def _multi_group(self, specs, per_group, layouts, primary, num_cpu_blocks, tp):  # type: ignore[no-untyped-def]
        tpb, kv_dim = primary.tokens_per_block, self.kv_dim
        block_bytes = tp * sum(
            g.num_layers * kv_dim * (tpb // g.compress_ratio) * g.num_kv_heads * g.head_size * g.dtype.itemsize
            for g in specs
        )
        self.cpu = torch.zeros((num_cpu_blocks, block_bytes), dtype=torch.uint8)
        self.cpu_block = block_bytes
        groups, offset = [], 0
        for g, gpu_layout, tensors in zip(specs, layouts, per_group):
            item = g.dtype.itemsize
            tpb_g = tpb // g.compress_ratio
            chunk = tpb_g * g.num_kv_heads * g.head_size * item
            probed = _probe(tensors[0], tpb_g, item, kv_dim)
            if probed is None:
                kv_s, block_s, layer_s = (s * item for s in _layout_strides(gpu_layout))
            else:
                kv_s, block_s, layer_s = probed
            ptrs = [t[0].data_ptr() for t in tensors]
            gpu = (kv_s, block_s, layer_s)
            groups.append(_Group(list(tensors), ptrs, chunk, *gpu, kv_dim * chunk, chunk, offset, g.num_layers))
            offset += g.num_layers * kv_dim * chunk
        return groups

    def _gpu_addr(self, g: _Group, layer: int, kv: int, block: int) -> int:
        w = lambda stride: stride // WORD  # noqa: E731 - the kernel's integer division
        if self.block_type == "SGLANG":
            return g.ptrs[kv * g.num_layers + layer] + block * w(g.gpu_block) * WORD
        if self.block_type == "VLLM":
            return g.ptrs[layer] + (kv * w(g.gpu_kv) + block * w(g.gpu_block)) * WORD
        return g.ptrs[0] + (block * w(g.gpu_block) + layer * w(g.gpu_layer) + kv * w(g.gpu_kv)) * WORD

    def _resolve(self, addr: int, n: int) -> torch.Tensor:
        return window(self.registered, addr, n)

    def transfer(self, gpu_blocks: list[int], cpu_blocks: list[int], to_gpu: bool) -> None:
        cpu = self.cpu.view(-1)
        for g in self.groups:
            words = g.chunk // WORD * WORD
            for gb, cb in zip(gpu_blocks, cpu_blocks):
                for layer in range(g.num_layers):
                    for kv in range(self.kv_dim):
                        gpu = self._resolve(self._gpu_addr(g, layer, kv, gb), words)
                        at = g.cpu_offset + (cb * (self.cpu_block // WORD) + layer * (g.cpu_layer // WORD)) * WORD
                        at += kv * (g.cpu_kv // WORD) * WORD
                        need = 16 if g.chunk % 16 == 0 else WORD  # transfer.cu's float4 path, else 8-byte
                        gpu_at, cpu_at = self._gpu_addr(g, layer, kv, gb), cpu.data_ptr() + at
                        assert gpu_at % need == 0 and cpu_at % need == 0, f"misaligned address for {need}-byte loads"
                        host = cpu[at : at + words]
                        assert host.numel() == words, "FlexKV would run past its CPU cache"
                        (gpu if to_gpu else host).copy_(host if to_gpu else gpu)

    def d2h(self, gpu_blocks: list[int], cpu_blocks: list[int]) -> None:
        self.transfer(gpu_blocks, cpu_blocks, to_gpu=False)

    def h2d(self, cpu_blocks: list[int], gpu_blocks: list[int]) -> None:
        self.transfer(gpu_blocks, cpu_blocks, to_gpu=True)
