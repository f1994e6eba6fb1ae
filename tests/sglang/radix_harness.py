"""SGLang 0.5.23's real FlexKVRadixCache on CPU: pools, paged allocator, ReqToTokenPool, requests.

Stubbed: CUDA streams (the constructor creates two) and the runtime ``spec`` config bag that
``checkpoint`` reads (published by a real server). Requests are plain objects carrying the fields the
radix cache reads; everything else is SGLang's code, reached through the class SGLang builds.
"""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace
from typing import Any

import torch

from . import flexkv_standin as fk
from .pools import KW, mha_pool, mla_pool, mp

RADIX = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache"
PAGE = 16


class CPUStream:
    def synchronize(self) -> None:
        pass


def stub_cuda(monkeypatch: Any) -> None:
    monkeypatch.setattr(torch.cuda, "Stream", CPUStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())


def make_pool(kind: str, size: int = 256, heads: int = 4) -> Any:
    return mha_pool(size=size, head_num=heads) if kind == "mha" else mla_pool(size=size)


def read(pool: Any, slots: torch.Tensor) -> list[bytes]:
    """The bytes of ``slots`` in every layer, through the pool's own getters."""
    out = []
    for layer in range(pool.layer_num):
        tensors = [pool.get_key_buffer(layer)]
        if hasattr(pool, "v_buffer"):
            tensors.append(pool.get_value_buffer(layer))
        out += [t[slots.long()].contiguous().view(torch.uint8).numpy().tobytes() for t in tensors]
    return out


def write(pool: Any, slots: torch.Tensor, seed: int) -> None:
    """What a forward pass leaves in ``slots``: bytes that differ per seed, layer and slot."""
    gen = torch.Generator().manual_seed(seed)
    buffers = list(pool.kv_buffer) if hasattr(pool, "kv_buffer") else [*pool.k_buffer, *pool.v_buffer]
    for t in buffers:
        rows = t[slots.long()]
        t[slots.long()] = (
            torch.randint(0, 255, rows.view(torch.uint8).shape, generator=gen, dtype=torch.uint8)
            .view(t.dtype)
            .view(rows.shape)
        )


def buffers(pool: Any) -> list[torch.Tensor]:
    return list(pool.kv_buffer) if hasattr(pool, "kv_buffer") else [*pool.k_buffer, *pool.v_buffer]


def zero(pool: Any, slots: torch.Tensor) -> None:
    for t in buffers(pool):
        t[slots.long()] = 0


def untouched_outside(before: list[torch.Tensor], pool: Any, slots: torch.Tensor) -> bool:
    """Every row of every buffer but ``slots`` still holds the bytes of ``before``: a restore writes nowhere else."""
    for old, new in zip(before, buffers(pool), strict=True):
        keep = torch.ones(new.shape[0], dtype=torch.bool)
        keep[slots.long()] = False
        if not torch.equal(old[keep].view(torch.uint8), new[keep].view(torch.uint8)):
            return False
    return True


def retake(alloc: Any, slots: torch.Tensor) -> set[int]:
    """Allocate pages until every one of ``slots`` is taken again: a restore must then go elsewhere."""
    taken: set[int] = set()
    while not set(slots.tolist()) <= taken:
        taken |= set(alloc.alloc(alloc.page_size).tolist())
    return taken


class Rig:
    """One rank's FlexKVRadixCache as SGLang's factory builds it, over a real pool and allocator."""

    def __init__(self, monkeypatch: Any, model: Any, kind: str, tp_size: int = 1, tp_rank: int = 0,
                 group: Any = None, pool: Any = None, kvcache: Any = None, page: int = PAGE) -> None:  # fmt: skip
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams

        stub_cuda(monkeypatch)
        self.rc = importlib.import_module(RADIX)
        monkeypatch.setattr(self.rc, "get_spec", lambda: SimpleNamespace(speculative_eagle_topk=None))
        self.pool = pool if pool is not None else make_pool(kind)
        self.alloc = PagedTokenToKVPoolAllocator(
            self.pool.size, page, torch.bfloat16, "cpu", self.pool if kvcache is None else kvcache, False
        )
        self.r2t = mp().ReqToTokenPool(size=8, max_context_len=256, **KW)
        params = CacheInitParams(
            disable=False, req_to_token_pool=self.r2t, token_to_kv_pool_allocator=self.alloc, page_size=page
        )
        self.cache = self.rc.FlexKVRadixCache(
            params=params, model_config=model, server_args=fk.ServerArgs(tp_size=tp_size), tp_rank=tp_rank,
            tp_size=tp_size, dp_rank=None, pp_rank=0, attn_cp_rank=0, tp_group=group, attn_tp_group=group,
        )  # fmt: skip

    def request(self, rid: str, ids: list[int], prompt: int, attempt: int = 0, seed: int | None = None,
                allocate: bool = True, **namespace: Any) -> SimpleNamespace:  # fmt: skip
        """A finished request whose KV sits in fresh slots (written with ``seed``), or a new one (no slots)."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        row, slots = None, None
        if allocate:
            (row,) = self.r2t.alloc_rows(1)
            slots = self.alloc.alloc(len(ids))
            assert slots is not None and len(slots) == len(ids)
            self.r2t.write((row, slice(0, len(ids))), slots)
            if seed is not None:
                write(self.pool, slots, seed)
        kv = SimpleNamespace(
            req_pool_idx=row, kv_committed_len=len(ids), cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0
        )
        return SimpleNamespace(
            kv=kv, slots=slots, extra_key=namespace.get("extra_key"), cache_salt=namespace.get("cache_salt"),
            multimodal_inputs=namespace.get("multimodal_inputs"), lora_id=namespace.get("lora_id"), rid=rid,
            priority=None, origin_input_ids=ids[:prompt], output_ids=ids[prompt:], full_untruncated_fill_ids=ids,
            lock=None, last_node=None, cache_request_handle=CacheRequestHandle(rid, attempt), finished=lambda: True,
        )  # fmt: skip

    def finish(self, req: SimpleNamespace) -> None:
        """Checkpoint (FlexKV store) and release the request, as the scheduler does at the end."""
        self.cache.checkpoint(req, up_to=len(req.full_untruncated_fill_ids))
        self.cache.unlock(req.lock)
        req.lock = None
        self.r2t.free_rows([req.kv.req_pool_idx])

    def evict_all(self) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return int(self.cache.evict(EvictParams(num_tokens=10**6)).num_tokens_evicted)

    def match(self, req: SimpleNamespace) -> Any:
        """The scheduler's first phase: match_prefix (the FlexKV lookup holds a task for ``req``'s handle)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = RadixKey(req.full_untruncated_fill_ids, req.extra_key, cache_salt=req.cache_salt)
        return self.cache.match_prefix(MatchPrefixParams(key=key, req=req))

    def load(self, req: SimpleNamespace, match: Any) -> tuple[int, torch.Tensor | None]:
        """The second phase: init_load_back (FlexKV retrieve) into freshly allocated slots."""
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        if match.host_hit_length <= 0:
            return match.device_prefix_len, None
        loaded, node = self.cache.init_load_back(
            InitLoadBackParams(best_match_node=match.last_device_node, host_hit_length=match.host_hit_length, req=req)
        )
        return loaded, (node.value if loaded else None)

    def match_and_load(self, req: SimpleNamespace) -> tuple[int, torch.Tensor | None]:
        return self.load(req, self.match(req))
