"""Test helpers: distinct-valued tensors, alias proofs, FlexKV's address arithmetic, SGLang-like pools."""

from __future__ import annotations

import torch


def distinct(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, start: int = 0) -> torch.Tensor:
    """A tensor whose elements are pairwise distinct (modulo 251 for 1-byte dtypes) and >= 0."""
    n = 1
    for s in shape:
        n *= s
    values = torch.arange(start, start + n, dtype=torch.int64)
    if dtype.itemsize == 1:
        values = values % 251
    return values.to(dtype).view(shape)


def _marker(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, 255 if t.dtype == torch.uint8 else -7)


def assert_aliases(view: torch.Tensor, region: torch.Tensor, root: torch.Tensor) -> None:
    """``view`` holds exactly ``region``'s elements, in order, in ``root``'s memory.

    Checks values element by element, then writes a marker through the view and reads it back
    through the region, and checks that exactly ``view.numel()`` elements of ``root`` changed.
    """
    assert view.shape == region.shape, (view.shape, region.shape)
    assert torch.equal(view, region)
    before = root.clone()
    view.copy_(_marker(view))
    assert torch.equal(region, _marker(region))
    assert int((root != before).sum()) == view.numel()
    root.copy_(before)


def flexkv_block_bytes(t: torch.Tensor, block: int, page_size: int) -> bytes:
    """The bytes FlexKV reads for ``block`` of a registered per-layer tensor.

    FlexKV ignores strides: block b starts at data_ptr + b * page_size * heads * dim * itemsize.
    """
    storage = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    start = t.data_ptr() - t.untyped_storage().data_ptr()
    size = page_size * t.shape[1] * t.shape[2] * t.element_size()
    return bytes(storage[start + block * size : start + (block + 1) * size].tolist())


def region_bytes(region: torch.Tensor) -> bytes:
    return bytes(region.contiguous().view(torch.uint8).flatten().tolist())


class SGLangLikeMHAPool:
    """Mirrors SGLang's MHATokenToKVPool attributes and raw getters (fp8 stored as uint8)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        v_head_dim: int | None = None,
    ) -> None:
        self.size, self.page_size, self.dtype = size, page_size, dtype
        self.store_dtype = torch.uint8 if dtype.itemsize == 1 and dtype != torch.uint8 else dtype
        self.head_num, self.head_dim = head_num, head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.layer_num, self.start_layer = layer_num, start_layer
        rows = size + page_size
        self.k_buffer = [distinct((rows, head_num, head_dim), self.store_dtype, 1000 * i) for i in range(layer_num)]
        self.v_buffer = [
            distinct((rows, head_num, self.v_head_dim), self.store_dtype, 1000 * i + 500) for i in range(layer_num)
        ]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        t = self.k_buffer[layer_id - self.start_layer]
        return t.view(self.dtype) if self.store_dtype != self.dtype else t

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        t = self.v_buffer[layer_id - self.start_layer]
        return t.view(self.dtype) if self.store_dtype != self.dtype else t


class SGLangLikeMLAPool:
    """Mirrors SGLang's MLATokenToKVPool: kv_buffer [size + page, 1, R + r]; V is K's first R."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        start_layer: int = 0,
    ) -> None:
        self.size, self.page_size, self.dtype, self.store_dtype = size, page_size, dtype, dtype
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.layer_num, self.start_layer = layer_num, start_layer
        self.kv_buffer = [
            distinct((size + page_size, 1, kv_lora_rank + qk_rope_head_dim), dtype, 1000 * i) for i in range(layer_num)
        ]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id - self.start_layer][..., : self.kv_lora_rank]


def flexkv_resolve_kv_buffers(kvcache: object) -> list[torch.Tensor]:
    """FlexKV's SGLang connector buffer resolution (non-DSv4 path), as documented in the seed."""
    if hasattr(kvcache, "kv_buffer"):
        return list(kvcache.kv_buffer)
    elif hasattr(kvcache, "k_buffer"):
        return list(kvcache.k_buffer) + list(kvcache.v_buffer)
    raise AttributeError(
        f"Unsupported KV cache type {type(kvcache).__name__}: expected kv_buffer (MLA/NSA) or k_buffer/v_buffer (MHA)."
    )


def _prod(xs: tuple[int, ...] | list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _layout_strides(fields: dict, item: int, num_head: int | None = None) -> tuple[int, int, int, int]:
    """(layer, block, kv, chunk) strides in bytes of a KVCacheLayout (storage.py kv_shape rules)."""
    lay, blk, kvd = fields["num_layer"], fields["num_block"], fields["kv_dim"]
    tail = [fields["tokens_per_block"], fields["num_head"] if num_head is None else num_head, fields["head_size"]]
    if fields["type"] == "LAYERFIRST":
        shape = [lay, kvd, blk, *tail]
        layer_s, block_s, kv_s = _prod(shape[1:]), _prod(shape[3:]), _prod(shape[2:])
    elif fields["type"] == "BLOCKFIRST":
        shape = [blk, lay, kvd, *tail]
        layer_s, block_s, kv_s = _prod(shape[2:]), _prod(shape[1:]), _prod(shape[3:])
    else:  # LAYERBLOCK
        shape = [lay, blk, kvd, *tail]
        layer_s, block_s, kv_s = _prod(shape[1:]), _prod(shape[2:]), _prod(shape[3:])
    return layer_s * item, block_s * item, kv_s * item, _prod(tail) * item


def _probe(t: torch.Tensor, tokens_per_block: int, item: int) -> tuple[int, int] | None:
    """worker.py _get_gpu_strides_from_tensor: K/V = first leading axis of size 2 (5-D, kv_dim 2)."""
    sizes = list(t.shape[:3])
    kv = next((i for i in range(3) if sizes[i] == 2), None)
    tok = next((i for i in range(3) if i != kv and sizes[i] == tokens_per_block), None)
    blk = next((i for i in range(3) if i not in (kv, tok)), None)
    if kv is None or blk is None:
        return None
    return t.stride(kv) * item, t.stride(blk) * item


def flexkv_worker_read(
    fields: dict, tensors: list[torch.Tensor], layer: int, kv: int, block: int, worker: str = "tp"
) -> bytes:
    """Bytes FlexKV's worker reads for (layer, kv, block): :func:`flexkv_worker_region`'s, copied out."""
    return bytes(flexkv_worker_region(fields, tensors, layer, kv, block, worker).tolist())


def flexkv_worker_region(
    fields: dict, tensors: list[torch.Tensor], layer: int, kv: int, block: int, worker: str = "tp"
) -> torch.Tensor:
    """The uint8 memory FlexKV's worker copies for (layer, kv, block), written from the contract (§1.1, §1.3, §1.4).

    Strides come from ``kv_shape`` in elements times the element size. The tp worker (``worker="tp"``)
    instead probes 5-D kv_dim=2 tensors when it gets more than one (consumers §3: first leading
    axis of size 2 = K/V); the layerwise and NIXL workers (``worker="layerwise"``) never do. The
    mode comes from the number of tensors. The kernel copies whole 8-byte words.
    """
    lay, kvd = fields["num_layer"], fields["kv_dim"]
    item = tensors[0].element_size()
    layer_s, block_s, kv_s, chunk = _layout_strides(fields, item)
    chunk -= chunk % 8
    if len(tensors) == 1:  # TRTLLM
        t, addr = tensors[0], tensors[0].data_ptr() + block * block_s + layer * layer_s + kv * kv_s
    elif len(tensors) == lay:  # VLLM
        t = tensors[layer]
        probed = _probe(t, fields["tokens_per_block"], item) if kvd == 2 and t.ndim == 5 else None
        if worker == "tp" and len(tensors) > 1 and probed is not None:
            kv_s, block_s = probed
        addr = t.data_ptr() + kv * kv_s + block * block_s
    elif len(tensors) == 2 * lay:  # SGLANG
        t = tensors[kv * lay + layer]
        addr = t.data_ptr() + block * block_s
    else:
        raise RuntimeError("Unsupported GPU block type")
    storage = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    start = addr - t.untyped_storage().data_ptr()
    assert start >= 0 and start + chunk <= storage.numel(), "FlexKV would read outside the allocation"
    return storage[start : start + chunk]  # aliases the registered tensor: writing it is FlexKV's restore


def flexkv_tp_roundtrip(
    ranks: list[tuple[dict, list[torch.Tensor]]],
    model_num_kv_heads: int,
    cpu_layout: str = "BLOCKFIRST",
    mode: str = "sharded",
) -> list[dict[tuple[int, int, int], bytes]]:
    """Offload every (layer, kv, block) of a TP group to FlexKV's CPU cache and restore it (consumers §1).

    ``ranks``: each rank's registered (layout fields, tensors). The CPU layout is built from the
    ModelConfig's ``num_kv_heads`` (storage_engine.py), never from the GPU layout. The GPU layout's
    ``num_kv_heads`` switches the tp worker (worker.py, tp_transfer_thread_group.cpp): >1 splits
    the CPU block (BLOCKFIRST: ``div_head(tp)``, which asserts) and puts rank i at
    ``i * cpu_block_stride // tp``; 1 means shared, and in ``sharded`` D2H rank i copies only slice
    i (``chunk // tp`` bytes at ``i * chunk // tp``) of its chunk; H2D always restores whole chunks.
    Offsets and sizes are truncated to 8-byte words. Returns what each rank holds after restore.
    """
    assert mode in ("sharded", "rank0_only"), "other FLEXKV_KV_SHARED_ACROSS_RANKS_MODE values are not modelled"
    fields = ranks[0][0]
    tp, shared = len(ranks), fields["num_kv_heads"] == 1
    item = ranks[0][1][0].element_size()
    cpu = dict(fields, type=cpu_layout, num_head=model_num_kv_heads)
    _, cpu_block_s, _, cpu_chunk = _layout_strides(cpu, item)
    heads = model_num_kv_heads
    if cpu_layout == "BLOCKFIRST" and not shared:
        assert heads % tp == 0, f"div_head({tp}) asserts: CPU num_head {heads} % {tp} != 0"
        heads //= tp
    cpu_layer_s, _, cpu_kv_s, _ = _layout_strides(cpu, item, heads)
    memory = bytearray(fields["num_layer"] * fields["kv_dim"] * fields["num_block"] * cpu_chunk)
    keys = [
        (lay, k, b)
        for lay in range(fields["num_layer"])
        for k in range(fields["kv_dim"])
        for b in range(fields["num_block"])
    ]

    def cpu_addr(lay: int, k: int, b: int) -> int:
        return b * cpu_block_s + lay * cpu_layer_s + k * cpu_kv_s

    originals = [{key: flexkv_worker_read(f, ts, *key) for key in keys} for f, ts in ranks]
    for i, chunks in enumerate(originals):  # D2H
        for key, gpu in chunks.items():
            gpu_off, cpu_off, size = 0, i * (cpu_block_s // tp), len(gpu)
            if shared:
                if mode == "sharded" and tp > 1:
                    gpu_off = cpu_off = i * (len(gpu) // tp)
                    size = len(gpu) // tp
                elif mode == "rank0_only" and i > 0:
                    continue
                else:
                    cpu_off = 0
            gpu_off, cpu_off, size = gpu_off // 8 * 8, cpu_off // 8 * 8, size // 8 * 8
            start = cpu_addr(*key) + cpu_off
            assert start + size <= len(memory), "FlexKV would write outside its CPU cache"
            memory[start : start + size] = gpu[gpu_off : gpu_off + size]
    restored = []
    for i, chunks in enumerate(originals):  # H2D
        offset = 0 if shared else i * (cpu_block_s // tp)
        restored.append({key: bytes(memory[cpu_addr(*key) + offset :][: len(gpu)]) for key, gpu in chunks.items()})
    return restored
