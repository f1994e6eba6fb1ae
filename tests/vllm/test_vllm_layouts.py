"""vLLM's real KV cache dicts (0.32 or 0.33) (every layout x MHA/MLA/kernel blocks/TP): adapted right, or refused.

Every accepted case is read back through FlexKV's worker address model for every layer, K/V half and
manager block, and compared with the bytes vLLM's own views hold; every refusal names the fix.
"""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import AmbiguousLayoutError, MLAView, NotAddressableError, adapt
from flexkv_adapter.flexkv import plan

from ..helpers import flexkv_worker_read
from .build import LAYOUTS, allocate, spec_of

LAYER_FIRST, BLOCK_FIRST = ("LBHNC", "LBNHC", "LHBNC"), ("BLHNC", "BLNHC", "BHLNC")
MHA_FIX = "VLLM_KV_CACHE_LAYOUT=LBNHC"
ONE_HEAD_FIX = "layer-outermost layout"

# The table docs/vllm.md ("Layouts") states: (layout, case) -> FlexKV layout type, or the fix a refusal names.
EXPECTED = {
    **{(lay, "mha3"): MHA_FIX for lay in LAYOUTS},
    ("LBNHC", "mha3"): "LAYERFIRST",
    ("BLNHC", "mha3"): "BLOCKFIRST",
    **{(lay, case): "LAYERFIRST" for lay in LAYER_FIRST for case in ("mha1", "mla", "mla128")},
    **{(lay, case): "BLOCKFIRST" for lay in BLOCK_FIRST for case in ("mha1", "mla", "mla128")},
}


def source_chunk(view: torch.Tensor, block: int, tokens: int) -> torch.Tensor:
    """Manager block ``block`` of a vLLM view as token-major [tokens, H, C] (a copy: test side only)."""
    ratio = tokens // view.shape[2]
    kernel = view[block * ratio : (block + 1) * ratio]  # [ratio, H, N, C]
    return kernel.permute(0, 2, 1, 3).reshape(tokens, view.shape[1], view.shape[3])


def bits(t: torch.Tensor) -> torch.Tensor:
    """The same elements as integers, so NaN bit patterns compare equal."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_flexkv_reads_vllm(fields, tensors, kv_caches, head_size: int) -> None:
    """For every layer, block and K/V half: FlexKV's read (layout ``fields``) equals vLLM's own view of that block."""
    for layer, view in enumerate(kv_caches.values()):
        for block in range(fields["num_block"]):
            got = flexkv_worker_read(fields, list(tensors), layer, 0, block)
            want = source_chunk(view, block, fields["tokens_per_block"])
            assert got == bytes(want.contiguous().view(torch.uint8).flatten().tolist()), (layer, block)
            cells = bits(torch.frombuffer(bytearray(got), dtype=view.dtype).view(want.shape))
            assert torch.equal(cells[..., :head_size], bits(want[..., :head_size]))  # K (or the MLA row)
            assert torch.equal(cells[..., head_size:], bits(want[..., head_size:]))  # V


@pytest.mark.parametrize("case", ["mha3", "mha1", "mla", "mla128"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_and_kind_is_adapted_right_or_refused(layout, case):
    kv_caches, kv_cache_config, _ = allocate(layout, case)
    spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
    kind = "mla" if case.startswith("mla") else "mha"
    expected = EXPECTED[(layout, case)]
    if expected not in ("LAYERFIRST", "BLOCKFIRST"):
        with pytest.raises(NotAddressableError, match=expected):
            plan(kv_caches, kind=kind, page_size=spec.block_size)
        return
    p = plan(kv_caches, kind=kind, page_size=spec.block_size)
    assert (p.type.value, p.kv_dim, p.num_head, p.tokens_per_block) == (expected, 1, spec.num_kv_heads, spec.block_size)
    assert p.head_size == spec.head_size + spec.head_size_v
    assert p.num_kv_heads == spec.num_kv_heads  # one rank: the heads it holds (MLA: 1)
    assert len(p.tensors) == (len(kv_caches) if expected == "LAYERFIRST" else 1)
    assert_flexkv_reads_vllm(p.layout_fields(), p.tensors, kv_caches, spec.head_size)
    # Zero-copy: a write through vLLM's view is what FlexKV reads next.
    view = kv_caches[list(kv_caches)[-1]]
    view[-1].fill_(3)
    last = flexkv_worker_read(p.layout_fields(), list(p.tensors), len(kv_caches) - 1, 0, p.num_block - 1)
    cell = torch.full((view.shape[1] * view.shape[3],), 3, dtype=view.dtype).view(torch.uint8)
    assert last[-cell.numel() :] == bytes(cell.tolist())  # the block's last token, every head


def test_mla_with_a_larger_manager_block_gets_kernel_block_views_and_is_regrouped():
    kv_caches, _, _ = allocate("LBNHC", "mla128")
    assert next(iter(kv_caches.values())).shape[2] == 64  # vLLM hands FlexKV 64-token kernel blocks
    p = plan(kv_caches, kind="mla", page_size=128)
    assert (p.num_block, p.tokens_per_block) == (5, 128)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_head_per_rank_at_tp2_registers_the_total_heads(layout):
    kv_caches, _, _ = allocate(layout, "mha1")
    with pytest.raises(AmbiguousLayoutError, match="kind="):
        plan(kv_caches, page_size=16, tp_size=2)
    with pytest.raises(AmbiguousLayoutError, match="total_kv_heads=1 / total_kv_heads=2"):
        plan(kv_caches, kind="mha", page_size=16, tp_size=2)  # MQA or split: the model config says which
    p = plan(kv_caches, kind="mha", page_size=16, tp_size=2, total_kv_heads=2)
    assert (p.num_head, p.num_kv_heads) == (1, 2)  # per rank 1, server-side 2 (not "shared", which corrupts)
    vllm_model = {
        "num_layers": p.num_layer,
        "num_kv_heads": 2,
        "head_size": p.head_size,
        "dtype": p.dtype,
        "tp_size": 2,
    }
    with_model = plan(kv_caches, kind="mha", page_size=16, tp_size=2, model_config={**vllm_model, "kv_dim": 1})
    assert with_model.layout_fields() == p.layout_fields()  # FlexKV's vLLM ModelConfig: kv_dim 1, heads x tp
    assert plan(kv_caches, kind="mha", page_size=16, tp_size=2, total_kv_heads=1).num_kv_heads == 1  # MQA
    assert plan(kv_caches, kind="mla", page_size=16, tp_size=2).num_kv_heads == 1
    assert_flexkv_reads_vllm(p.layout_fields(), p.tensors, kv_caches, 8)


def test_mha_multi_head_counts_heads_across_ranks():
    kv_caches, _, _ = allocate("LBNHC", "mha3")
    assert plan(kv_caches, page_size=16, tp_size=2).num_kv_heads == 6


def test_padded_mla_pages_are_refused():
    spec = spec_of("mla", alignment=1000)  # page_size_padded: blocks carry padding FlexKV cannot express
    assert spec.page_size_padded is not None
    kv_caches, _, _ = allocate("LBNHC", "mla", spec=spec)
    with pytest.raises(NotAddressableError, match="padd"):
        plan(kv_caches, kind="mla", page_size=64)


def test_kv_sharing_aliases_register_per_layer_and_refuse_block_first():
    kv_caches, _, _ = allocate("LBNHC", "mla")
    kv_caches["model.layers.3.self_attn.attn"] = kv_caches["model.layers.0.self_attn.attn"]
    p = plan(kv_caches, kind="mla", page_size=64)
    assert p.tensors[3].data_ptr() == p.tensors[0].data_ptr()
    assert_flexkv_reads_vllm(p.layout_fields(), p.tensors, kv_caches, 24)
    kv_caches, _, _ = allocate("BLNHC", "mla")
    kv_caches["model.layers.3.self_attn.attn"] = kv_caches["model.layers.0.self_attn.attn"]
    with pytest.raises(NotAddressableError, match="aliases"):
        plan(kv_caches, kind="mla", page_size=64)


def test_adapt_exposes_vllm_mla_rows_and_refuses_packed_mha():
    kv_caches, _, _ = allocate("LBNHC", "mla128")
    view = adapt(kv_caches, page_size=128, kind="mla")
    assert isinstance(view, MLAView) and view.num_blocks == 5 and view.page_size == 128
    first = next(iter(kv_caches.values()))
    view.kv_buffer[0][130].fill_(7)  # row 130 = manager block 1, token 2 = kernel block 2, token 2
    assert torch.equal(bits(first[2, 0, 2]), bits(torch.full((24,), 7, dtype=first.dtype)))
    with pytest.raises(AmbiguousLayoutError, match="kind="):
        adapt(kv_caches, page_size=128)
    mha, _, _ = allocate("LBNHC", "mha3")
    with pytest.raises(NotAddressableError, match="plan"):
        adapt(mha, page_size=16)


def test_layers_in_separate_storages_are_not_called_kv_sharing_aliases():
    """One vLLM allocation per layer (vLLM 0.34's extensible KV cache gives each layer its own storage): every
    view starts at offset 0, which is no alias; the note says what it is. KV sharing stays an alias (control)."""
    from flexkv_adapter.readers.vllm_layout import vllm_form

    names = [f"model.layers.{i}.self_attn.attn" for i in range(3)]
    separate = {n: next(iter(allocate("LBNHC", "mla", layers=1)[0].values())) for n in names}
    note = vllm_form(separate, kind="mla", block_size=64).note
    assert "alias" not in note and "separate storages" in note
    sharing, _, _ = allocate("LBNHC", "mla")
    sharing["model.layers.3.self_attn.attn"] = sharing[names[0]]
    assert "KV-sharing layers alias" in vllm_form(sharing, kind="mla", block_size=64).note
