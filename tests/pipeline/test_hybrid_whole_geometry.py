"""Whole pools over many geometries: every registration round-trips exactly or is refused.

The stand-in worker (tests/multigroup_worker.py) packs each CPU block group after group, as FlexKV's
``_init_multi_group`` does, and faults like ``transfer.cu`` on a misaligned 16-byte access: a group
whose chunk is a multiple of 16 bytes gets 16-byte loads, so its CPU offset inside the block and the
block's size must be multiples of 16 too.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.errors import NotAddressableError
from flexkv_adapter.flexkv import plan

from ..sglang.whole_pools import roundtrip

FIXTURE_OK = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def mla_fp4_like(page: int, layers: int, pages: int = 4, rank: int = 512, rope: int = 64) -> SimpleNamespace:
    """SGLang's MLATokenToKVPoolFP4: packed KV (2 values a byte) and one scale byte per 16 values, per token."""
    rows = pages * page
    return SimpleNamespace(
        kv_buffer=[torch.zeros(rows, 1, (rank + rope) // 2, dtype=torch.uint8) for _ in range(layers)],
        kv_scale_buffer=[torch.zeros(rows, (rank + rope) // 16, dtype=torch.uint8) for _ in range(layers)],
        page_size=page,
    )


def dsa_like(page: int, layers: int, kpool: int, index_dim: int, skip: tuple[bool, ...], start: int) -> SimpleNamespace:
    """SGLang's DSATokenToKVPool: MLA KV, one index row per page of page/kpool tokens (index_dim + 4 bytes each)."""
    rows, tokens = 4 * page, page // kpool
    return SimpleNamespace(
        kv_buffer=[torch.zeros(rows, 1, 32, dtype=torch.bfloat16) for _ in range(layers)],
        index_k_with_scale_buffer=[
            torch.zeros(0 if skip[i] else 4, tokens * (index_dim + 4), dtype=torch.uint8) for i in range(layers)
        ],
        index_kpool=kpool,
        page_size=page,
        start_layer=start,
        layer_num=layers,
    )


@pytest.mark.parametrize("page, layers", [(2, 1), (2, 3), (6, 3)])
def test_a_16_byte_group_behind_an_8_byte_group_is_refused_not_faulted(page, layers, fake_flexkv):
    # KV chunk 288*page (16-byte loads); scale chunk 36*page = 8 mod 16: the CPU block is 8 mod 16 bytes,
    # so block 1's KV starts misaligned and FlexKV's float4 kernel faults (misaligned address).
    with pytest.raises(NotAddressableError, match="16"):
        plan(adapt(mla_fp4_like(page, layers)))


def test_the_same_pool_with_16_byte_multiples_round_trips(fake_flexkv):
    assert roundtrip(mla_fp4_like(16, 3), reader=lambda pool: []) == []


@FIXTURE_OK
@given(page=st.sampled_from([2, 4, 6, 8, 16]), layers=st.integers(1, 4))
def test_mla_fp4_like_round_trips_or_is_refused(page, layers, fake_flexkv):
    try:
        wrong = roundtrip(mla_fp4_like(page, layers), reader=lambda pool: [])
    except AdapterError:
        return
    assert wrong == []


@FIXTURE_OK
@given(
    page=st.sampled_from([2, 4, 8, 16, 64]),
    layers=st.integers(1, 4),
    kpool=st.sampled_from([1, 2, 4]),
    index_dim=st.sampled_from([4, 12, 64, 128]),
    data=st.data(),
)
def test_dsa_like_round_trips_or_is_refused(page, layers, kpool, index_dim, data, fake_flexkv):
    skip = tuple(data.draw(st.lists(st.booleans(), min_size=layers, max_size=layers)))
    start = data.draw(st.sampled_from([0, 3]))
    if page % kpool:
        return
    pool = dsa_like(page, layers, kpool, index_dim, skip, start)
    try:
        if not plan(adapt(pool)).groups:  # every layer skips top-k: one group, FlexKV's uniform path
            return
        wrong = roundtrip(pool, reader=lambda pool: [])
    except AdapterError:
        return
    assert wrong == []


@pytest.mark.parametrize("via", ["view", "raw"])
def test_an_indexer_pool_adapted_for_the_kv_alone_is_not_registered_without_its_indexer(via, fake_flexkv):
    # adapt(dsa, hybrid="error") keeps the plain MLA view for FlexKV's own connectors (they read the indexer
    # themselves); plan()/register() of it would send the KV alone and restore prefixes without the indexer.
    pool = dsa_like(64, 2, 1, 128, (False, False), 0)
    with pytest.raises(AdapterError, match="index_k_with_scale_buffer"):
        plan(adapt(pool, hybrid="error") if via == "view" else pool, **({} if via == "view" else {"hybrid": "error"}))
    assert len(plan(adapt(pool)).groups) == 2  # the whole registration is what plan() offers instead


def test_a_tensor_that_starts_at_the_kv_but_holds_more_is_not_taken_as_covered():
    # One arena holds every layer's KV and then other state; its first byte is k_buffer[0]'s, so a check by
    # start address alone would count it registered and leave its tail out of FlexKV silently.
    rows, layers, kv_bytes = 64, 2, 2 * 2 * 64 * 16
    arena = torch.zeros(kv_bytes + 4096, dtype=torch.uint8)
    kv = arena[:kv_bytes].view(2, layers, rows, 2, 8)
    scales = [torch.zeros(rows, 2, dtype=torch.uint8) for _ in range(2 * layers)]
    pool = SimpleNamespace(k_buffer=list(kv[0]), v_buffer=list(kv[1]), page_size=16, arena=arena)
    pool.k_scale_buffer, pool.v_scale_buffer = scales[:layers], scales[layers:]
    with pytest.raises(AdapterError, match="arena"):
        adapt(pool)
    pool.arena = arena[:kv_bytes]  # exactly the registered bytes: nothing is left out
    assert adapt(pool).whole is not None
