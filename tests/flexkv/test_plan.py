"""FlexKV layout/registration plans, checked against a reference model of FlexKV's worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import InconsistentLayersError, NotAddressableError, UnsupportedPoolError, adapt
from flexkv_adapter.errors import FlexKVUnavailableError, PlanError
from flexkv_adapter.flexkv import AddressingMode, LayoutType, plan

from ..helpers import SGLangLikeMHAPool, SGLangLikeMLAPool, distinct, flexkv_worker_read, region_bytes

L, NB, PS, H, D = 3, 4, 16, 2, 8


def _sglang_mha():
    pool = SGLangLikeMHAPool(size=48, page_size=PS, dtype=torch.bfloat16, head_num=H, head_dim=D, layer_num=L)
    return pool, {}, lambda lay, k, b: (pool.k_buffer, pool.v_buffer)[k][lay][b * PS : (b + 1) * PS]


def _sglang_mla():
    pool = SGLangLikeMLAPool(48, PS, torch.bfloat16, kv_lora_rank=12, qk_rope_head_dim=4, layer_num=L)
    return pool, {}, lambda lay, k, b: pool.kv_buffer[lay][b * PS : (b + 1) * PS]


def _flat_kv_first():
    f = distinct((2, L, NB * PS + 5, H, D), torch.int32)
    return f, {"page_size": PS, "layer_num": L}, lambda lay, k, b: f[k, lay, b * PS : (b + 1) * PS]


def _vllm_kv_first():
    d = {f"model.layers.{i}.attn": distinct((2, NB, PS, H, D), torch.int32, 10_000 * i) for i in range(L)}
    return d, {"head_num": H}, lambda lay, k, b: d[f"model.layers.{lay}.attn"][k, b]


def _vllm_blocks_first():
    d = {f"model.layers.{i}.attn": distinct((NB, 2, PS, H, D), torch.int32, 10_000 * i) for i in range(L)}
    return d, {"head_num": H}, lambda lay, k, b: d[f"model.layers.{lay}.attn"][b, k]


def _vllm_mla():
    d = [distinct((NB, PS, 12), torch.int32, 10_000 * i) for i in range(L)]
    return d, {"page_size": PS}, lambda lay, k, b: d[lay][b]


def _trtllm_block_first():
    t = distinct((NB, L, 2, PS, H, D), torch.int32)
    return t, {"page_size": PS}, lambda lay, k, b: t[b, lay, k]


CASES = {
    "sglang-mha": (_sglang_mha, AddressingMode.SGLANG, LayoutType.LAYERFIRST, 2 * L),
    "sglang-mla": (_sglang_mla, AddressingMode.VLLM, LayoutType.LAYERFIRST, L),
    "flat-kv-first": (_flat_kv_first, AddressingMode.SGLANG, LayoutType.LAYERFIRST, 2 * L),
    "vllm<=0.21": (_vllm_kv_first, AddressingMode.VLLM, LayoutType.LAYERFIRST, L),
    "vllm>=0.23": (_vllm_blocks_first, AddressingMode.VLLM, LayoutType.LAYERBLOCK, L),
    "vllm-mla": (_vllm_mla, AddressingMode.VLLM, LayoutType.LAYERFIRST, L),
    "trtllm": (_trtllm_block_first, AddressingMode.TRTLLM, LayoutType.BLOCKFIRST, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flexkv_reads_every_block_where_the_source_keeps_it(case):
    build, mode, layout_type, count = CASES[case]
    source, options, block_of = build()
    p = plan(source, **options)
    assert (p.mode, p.type, len(p.tensors)) == (mode, layout_type, count)
    fields = p.layout_fields()
    for layer in range(p.num_layer):
        for kv in range(p.kv_dim):
            for block in range(p.num_block):
                expected = region_bytes(block_of(layer, kv, block))
                assert flexkv_worker_read(fields, list(p.tensors), layer, kv, block) == expected
                assert p.address(layer, kv, block) == block_of(layer, kv, block).data_ptr()


def test_plan_of_an_mha_view_registers_all_k_then_all_v():
    pool, _, _ = _sglang_mha()
    p = plan(adapt(pool))
    assert [t.data_ptr() for t in p.tensors] == [t.data_ptr() for t in pool.k_buffer + pool.v_buffer]
    assert p.layout_fields() == {
        "type": "LAYERFIRST",
        "num_layer": L,
        "num_block": 4,
        "tokens_per_block": PS,
        "num_head": H,
        "head_size": D,
        "kv_dim": 2,
        "num_kv_heads": H,
    }
    assert p.kv_shape == (L, 2, 4, PS, H, D) and p.chunk_bytes == PS * H * D * 2


def test_mla_is_shared_across_ranks():
    pool, _, _ = _sglang_mla()
    p = plan(adapt(pool), tp_size=8)
    assert (p.num_head, p.num_kv_heads, p.kv_dim) == (1, 1, 1)


def test_v_head_dim_different_from_head_dim_is_refused():
    pool = SGLangLikeMHAPool(48, PS, torch.bfloat16, head_num=H, head_dim=D, layer_num=L, v_head_dim=4)
    with pytest.raises(PlanError, match="head_dim 8 != v_head_dim 4"):
        plan(adapt(pool))


def test_model_dtype_must_have_the_tensor_element_size():
    pool = SGLangLikeMHAPool(48, PS, torch.float8_e4m3fn, head_num=H, head_dim=D, layer_num=L)
    assert plan(adapt(pool), model_dtype=torch.float8_e4m3fn).dtype == torch.uint8
    with pytest.raises(PlanError, match="FLEXKV_KV_CACHE_DTYPE"):
        plan(adapt(pool), model_dtype=torch.bfloat16)


def test_head_major_blocks_are_refused():
    per_layer = [distinct((2, NB, H, PS, D)) for _ in range(L)]
    with pytest.raises(NotAddressableError, match="head-major"):
        plan(per_layer, axes="KV P H T D")


def test_padded_block_first_tensor_is_refused():
    padded = distinct((NB, L, 2, PS, H, D + 2))[..., :D]  # padding inside each chunk
    with pytest.raises(NotAddressableError):
        plan(padded, page_size=PS, axes="P L KV T H D")


def test_plan_page_size_must_match_the_block_size():
    d, _, _ = _vllm_kv_first()
    with pytest.raises(Exception, match="16"):
        plan(d, head_num=H, page_size=8)


def test_to_flexkv_builds_flexkvs_layout(fake_flexkv):
    pool, _, _ = _sglang_mha()
    p = plan(adapt(pool), tp_size=2)
    layout = p.to_flexkv()
    assert layout.type.name == "LAYERFIRST" and layout.kv_shape == p.kv_shape
    assert (layout.num_head, layout.num_kv_heads, layout.kv_dim) == (H, 2 * H, 2)


def test_to_flexkv_without_flexkv_gives_the_install_hint(no_flexkv):
    pool, _, _ = _sglang_mha()
    with pytest.raises(FlexKVUnavailableError, match="build it from source"):
        plan(adapt(pool)).to_flexkv()


def test_split_paged_lists_are_registered_as_flat_views():
    ks = [distinct((NB, PS, H, D), torch.int32, 1000 * i) for i in range(L)]
    vs = [distinct((NB, PS, H, D), torch.int32, 1000 * i + 500) for i in range(L)]
    p = plan(SimpleNamespace(k_cache=ks, v_cache=vs), head_num=H)
    assert p.mode is AddressingMode.SGLANG and p.num_block == NB
    assert flexkv_worker_read(p.layout_fields(), list(p.tensors), 2, 1, 3) == region_bytes(vs[2][3])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": "2"}, "tp_size must be a positive integer, got '2'"),
        ({"tp_size": 2.5}, "tp_size must be a positive integer, got 2.5"),
        ({"tp_size": True}, "tp_size must be a positive integer, got True"),
        ({"tp_size": 0}, "tp_size must be a positive integer, got 0"),
        ({"total_kv_heads": 2.0}, "total_kv_heads must be a positive integer"),
        ({"model_dtype": "bfloat16"}, "model_dtype must be a torch.dtype"),
        ({"model_config": {"num_layers": 3}}, "lacks \\['num_kv_heads', 'head_size', 'dtype', 'tp_size'\\]"),
        (
            {"model_config": {"num_layers": 3, "num_kv_heads": 2, "head_size": 8, "dtype": "bf16", "tp_size": 1}},
            "model_config dtype must be a torch.dtype",
        ),
        (
            {
                "model_config": {
                    "num_layers": True,
                    "num_kv_heads": 2,
                    "head_size": 8,
                    "dtype": torch.int32,
                    "tp_size": 1,
                }
            },
            "model_config.num_layers must be a positive integer",
        ),
        (
            {
                "tp_size": 2,
                "model_config": {
                    "num_layers": 3,
                    "num_kv_heads": 2,
                    "head_size": 8,
                    "dtype": torch.int32,
                    "tp_size": 1,
                },
            },
            "tp_size=2 contradicts model_config.tp_size=1",
        ),
        ({"total_kv_heads": 6, "tp_size": 4}, "total_kv_heads=6 does not match 2 head\\(s\\) per rank x tp_size=4"),
        ({"total_kv_heads": 9, "tp_size": 4}, "not divisible by tp_size"),
    ],
)
def test_plan_arguments_are_validated_at_the_boundary(kwargs, message):
    d, _, _ = _vllm_kv_first()
    with pytest.raises(PlanError, match=message):
        plan(d, head_num=H, **kwargs)


def test_plan_of_raw_layers_applies_adapts_consistency_checks():
    # three layers: a two-element list of [2, ...] tensors also reads as [K_all, V_all] (ambiguous)
    mixed = [distinct((2, NB, PS, H, D), t) for t in (torch.int16, torch.int16, torch.bfloat16)]
    with pytest.raises(InconsistentLayersError, match="layer 2 K .*bfloat16.*layer 0 has .*int16"):
        plan(mixed, head_num=H)
    two_devices = [
        distinct((2, NB, PS, H, D), torch.int16),
        torch.empty((2, NB, PS, H, D), dtype=torch.int16, device="meta"),
    ]
    with pytest.raises(UnsupportedPoolError, match=r"\[1\] is on the meta device"):  # no memory: refused first
        plan(two_devices, head_num=H)
    with pytest.raises(InconsistentLayersError):
        plan([distinct((NB, PS, 12), torch.int16), distinct((NB, PS, 12), torch.bfloat16)], page_size=PS)


def test_options_for_a_view_are_refused_instead_of_ignored():
    pool, _, _ = _sglang_mha()
    with pytest.raises(PlanError, match="already adapted"):
        plan(adapt(pool), page_size=8)
