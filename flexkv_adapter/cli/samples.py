"""Small CPU pools of every kind the library supports (and some it refuses), for the demo.

Dimensions are pairwise distinct (layers 3, heads 4, head dim 8, v head dim 6, rows 70, page 16)
so a swapped axis cannot pass by accident. Pools are plain objects carrying the same attributes
as the engines' pools; nothing here imports SGLang or vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

L, H, D, DV, PS, BLOCKS = 3, 4, 8, 6, 16, 5
SIZE = 54  # allocatable tokens; SGLang pools hold SIZE + PS rows (slot 0 is the dummy page)
ROWS = SIZE + PS
KV_LORA, ROPE = 24, 8
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Sample:
    """A named pool builder, the adapt() options it needs, and whether adapt() (or plan()) must refuse it."""

    name: str
    build: Callable[[], object]
    options: dict[str, Any] = field(default_factory=dict)
    refused_with: str | None = None
    plan_refusal: str = ""  # why plan() must refuse the view adapt() returns; empty: plan() must accept it
    plan_short: str = ""  # that reason in a few words, for the demo's flexkv column


_NARROW_V = (
    f"V heads are narrower than K heads (head_dim {D}, v_head_dim {DV}): FlexKV takes one head_size for K and V, "
    "so plan() refuses a view adapt() can still give"
)


def _mha_pool(store_dtype: torch.dtype = DTYPE, start_layer: int = 0) -> SimpleNamespace:
    dtype = torch.float8_e4m3fn if store_dtype == torch.uint8 else store_dtype
    return SimpleNamespace(
        k_buffer=[torch.zeros(ROWS, H, D, dtype=store_dtype) for _ in range(L)],
        v_buffer=[torch.zeros(ROWS, H, DV, dtype=store_dtype) for _ in range(L)],
        size=SIZE,
        page_size=PS,
        layer_num=L,
        head_num=H,
        head_dim=D,
        v_head_dim=DV,
        start_layer=start_layer,
        dtype=dtype,
        store_dtype=store_dtype,
    )


def _mla_pool() -> SimpleNamespace:
    return SimpleNamespace(
        kv_buffer=[torch.zeros(ROWS, 1, KV_LORA + ROPE, dtype=DTYPE) for _ in range(L)],
        size=SIZE,
        page_size=PS,
        layer_num=L,
        kv_lora_rank=KV_LORA,
        qk_rope_head_dim=ROPE,
        start_layer=0,
    )


def _renamed(k: str, v: str) -> Callable[[], object]:
    return lambda: SimpleNamespace(
        **{
            k: [torch.zeros(ROWS, H, D, dtype=DTYPE) for _ in range(L)],
            v: [torch.zeros(ROWS, H, D, dtype=DTYPE) for _ in range(L)],
        },
        page_size=PS,
    )


def _vllm_dict(kv_first: bool) -> Callable[[], object]:
    shape = (2, BLOCKS, PS, H, D) if kv_first else (BLOCKS, 2, PS, H, D)
    return lambda: {f"model.layers.{i}.self_attn.attn": torch.zeros(shape, dtype=DTYPE) for i in range(L)}


def _byte_buffer() -> torch.Tensor:
    return torch.zeros(L * 2 * ROWS * H * D * 2 + 64, dtype=torch.uint8)


@dataclass(frozen=True)
class MambaState:
    """Shaped like SGLang's MambaPool.State: conv inputs per layer group, and the SSM state."""

    conv: list[torch.Tensor]
    temporal: torch.Tensor


def _sub_pool(layer_ids: list[int], rows: int = ROWS) -> SimpleNamespace:
    return SimpleNamespace(
        k_buffer=[torch.zeros(rows, H, D, dtype=DTYPE) for _ in layer_ids],
        v_buffer=[torch.zeros(rows, H, D, dtype=DTYPE) for _ in layer_ids],
        page_size=PS,
        layer_num=len(layer_ids),
        head_num=H,
        head_dim=D,
        model_layer_ids=tuple(layer_ids),
    )


def _swa_pool() -> SimpleNamespace:
    full, swa = [1, 4], [0, 2, 3]
    mapping = {**{g: (i, False) for i, g in enumerate(full)}, **{g: (i, True) for i, g in enumerate(swa)}}
    return SimpleNamespace(
        full_kv_pool=_sub_pool(full), swa_kv_pool=_sub_pool(swa, rows=2 * PS), layers_mapping=mapping, page_size=PS
    )


def _hybrid_linear_pool() -> SimpleNamespace:
    mamba_ids = [0, 1, 3]
    mamba = SimpleNamespace(
        mamba_cache=MambaState(conv=[torch.zeros(len(mamba_ids), 9, 24, 3)], temporal=torch.zeros(3, 9, 2, 4, 8)),
        mamba_layer_ids=mamba_ids,
    )
    return SimpleNamespace(
        full_kv_pool=_sub_pool([2, 5]), full_attention_layer_id_mapping={2: 0, 5: 1}, mamba_pool=mamba, page_size=PS
    )


def _minimax_pool() -> SimpleNamespace:
    index_kv = SimpleNamespace(
        k_buffer=[torch.zeros(ROWS, 1, 16, dtype=DTYPE)], v_buffer=[torch.zeros(ROWS, 1, 16, dtype=DTYPE)]
    )
    index_k = SimpleNamespace(k_buffer=[torch.zeros(ROWS, 1, 16, dtype=DTYPE)])
    return SimpleNamespace(
        main_pool=_sub_pool([0, 1, 2]),
        index_kv_pool=index_kv,
        index_k_pool=index_k,
        index_kv_layer_id_mapping={1: 0},
        index_k_layer_id_mapping={2: 0},
        page_size=PS,
    )


SAMPLES: tuple[Sample, ...] = (
    Sample("sglang MHA", _mha_pool, plan_refusal=_NARROW_V, plan_short="narrow V"),
    Sample("sglang MHA fp8 (uint8)", lambda: _mha_pool(torch.uint8), plan_refusal=_NARROW_V, plan_short="narrow V"),
    Sample("sglang MHA, PP stage 2", lambda: _mha_pool(start_layer=L), plan_refusal=_NARROW_V, plan_short="narrow V"),
    Sample("sglang MLA", _mla_pool),
    Sample("renamed k_cache/v_cache", _renamed("k_cache", "v_cache")),
    Sample("renamed key_cache/value_cache", _renamed("key_cache", "value_cache")),
    Sample("renamed k_buffers/v_buffers", _renamed("k_buffers", "v_buffers")),
    Sample(
        "renamed kv_cache [2, L, N, H, D]",
        lambda: SimpleNamespace(kv_cache=torch.zeros(2, L, ROWS, H, D, dtype=DTYPE), layer_num=L, page_size=PS),
    ),
    Sample(
        "renamed kv_cache MLA list",
        lambda: SimpleNamespace(
            kv_cache=[torch.zeros(ROWS, 1, KV_LORA + ROPE, dtype=DTYPE) for _ in range(L)], page_size=PS
        ),
    ),
    Sample(
        "renamed kv_caches [2, N, H, D] list",
        lambda: SimpleNamespace(
            kv_caches=[torch.zeros(2, ROWS, H, D, dtype=DTYPE) for _ in range(L)], page_size=PS, head_num=H
        ),
    ),
    Sample("vLLM <= 0.21 dict [2, NB, BS, H, D]", _vllm_dict(kv_first=True), {"head_num": H}),
    Sample(
        "plain list of [2, N, H, D]",
        lambda: [torch.zeros(2, ROWS, H, D, dtype=DTYPE) for _ in range(L)],
        {"page_size": PS},
    ),
    Sample("flat [L, 2, N, H, D]", lambda: torch.zeros(L, 2, ROWS, H, D, dtype=DTYPE), {"page_size": PS}),
    Sample(
        "flat [2, L, N, H, D]", lambda: torch.zeros(2, L, ROWS, H, D, dtype=DTYPE), {"page_size": PS, "layer_num": L}
    ),
    Sample("flat MLA [L, N, D]", lambda: torch.zeros(L, ROWS, KV_LORA + ROPE, dtype=DTYPE), {"page_size": PS}),
    Sample("flat MLA [L, N, 1, D]", lambda: torch.zeros(L, ROWS, 1, KV_LORA + ROPE, dtype=DTYPE), {"page_size": PS}),
    Sample(
        "1-D byte buffer + geometry",
        _byte_buffer,
        {"page_size": PS, "shape": (L, 2, ROWS, H, D), "dtype": DTYPE, "axes": "L KV N H D", "offset": 64},
    ),
    Sample("hybrid SWA (attention_only)", _swa_pool, {"hybrid": "attention_only"}),
    Sample("hybrid linear + Mamba (attention_only)", _hybrid_linear_pool, {"hybrid": "attention_only"}),
    Sample("MiniMax sparse (attention_only)", _minimax_pool, {"hybrid": "attention_only"}),
    Sample("hybrid SWA (default policy)", _swa_pool, refused_with="HybridPoolError"),
    Sample(
        "vLLM >= 0.23 dict [NB, 2, BS, H, D]",
        _vllm_dict(kv_first=False),
        {"head_num": H},
        refused_with="NotAddressableError",
    ),
    Sample(
        "token-major [N, L, 2, H, D]",
        lambda: torch.zeros(ROWS, L, 2, H, D, dtype=DTYPE),
        {"page_size": PS, "axes": "N L KV H D"},
        refused_with="NotAddressableError",
    ),
    Sample(
        "ambiguous [2, 2, N, 2, D]",
        lambda: torch.zeros(2, 2, ROWS, 2, D, dtype=DTYPE),
        {"page_size": PS},
        refused_with="AmbiguousLayoutError",
    ),
)
