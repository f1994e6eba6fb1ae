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
