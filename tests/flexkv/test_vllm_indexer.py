"""vLLM indexer entries (DeepSeek-V3.2 ``.k_cache``) are accepted exactly when FlexKV 34ab141's own split reads
them right: block b of each entry at ``data_ptr + b * shape[1] * shape[2] * itemsize``, the first entry's layout
for all, the main KV's block ids, ``compress_ratio = block_size // shape[1]`` (vllm_v1_adapter.py:907-957)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.errors import AdapterError, InconsistentLayersError
from flexkv_adapter.flexkv.vllm_indexer import check_indexer

FAULTS = ("strided", "short", "other_shape", "other_dtype", "alias", "overlap", "ratio", "meta", "two_d")


def _reads(t: torch.Tensor, block: int) -> bytes:
    """What FlexKV's worker copies for ``block``: ``shape[1] * shape[2]`` elements from the block's address."""
    n = t.shape[1] * t.shape[2]
    raw = t.untyped_storage()
    start = t.storage_offset() * t.element_size() + block * n * t.element_size()
    return bytes(raw[start : start + n * t.element_size()])


@st.composite
def indexer_dicts(draw):
    """Indexer entries for a main KV of ``blocks`` x ``page``-token blocks, and the faults put in them."""
    blocks, layers = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    tokens = draw(st.sampled_from([4, 8]))
    page = tokens * draw(st.sampled_from([1, 2]))
    width = draw(st.sampled_from([3, 6]))
    faults = draw(st.sets(st.sampled_from(FAULTS), max_size=2))
    extra = draw(st.integers(0, 2))  # more rows than blocks: FlexKV never reads them
    entries = {}
    base = torch.arange(layers * (blocks + extra) * tokens * width, dtype=torch.int16)
    for i, chunk in enumerate(base.view(layers, blocks + extra, tokens, width).unbind(0)):
        entries[f"model.layers.{i}.self_attn.indexer.k_cache"] = chunk
    names = list(entries)
    victim = names[-1]
    if "strided" in faults:  # every other row of a taller buffer: block stride twice FlexKV's
        tall = torch.arange((blocks + extra) * 2 * tokens * width, dtype=torch.int16)
        entries[victim] = tall.view(-1, tokens, width)[::2]
    if "short" in faults:
        entries[victim] = entries[victim][: max(blocks - 1, 0)]
    if "other_shape" in faults:
        entries[victim] = torch.zeros(blocks + extra, tokens, width + 1, dtype=torch.int16)
    if "other_dtype" in faults:
        entries[victim] = entries[victim].to(torch.float16)
    if "alias" in faults and len(names) > 1:  # one tensor under two layer names (vLLM's KV sharing): the same
        entries[victim] = entries[names[0]]  # bytes block for block, which FlexKV stores twice; accepted
    if "overlap" in faults and len(names) > 1:  # another entry's bytes, one block on
        whole = base.view(-1, tokens, width)
        entries[victim] = whole[1 : 1 + blocks + extra]
    if "ratio" in faults:
        page = tokens * 2 + tokens // 2  # the main block is not a multiple of the indexer's
    if "meta" in faults:
        entries[victim] = torch.empty(entries[victim].shape, dtype=entries[victim].dtype, device="meta")
    if "two_d" in faults:
        entries = {n: t.flatten(1) for n, t in entries.items()}
    return entries, blocks, page, faults


def _faulty(entries, blocks, page) -> bool:
    """The oracle: whether FlexKV's arithmetic would read another entry's bytes, or past an end."""
    tensors = list(entries.values())
    first = tensors[0]
    if any(t.is_meta for t in tensors) or first.ndim != 3:
        return True
    if any((t.shape, t.dtype) != (first.shape, first.dtype) for t in tensors):
        return True
    if first.shape[0] < blocks or first.shape[0] == 0 or page % first.shape[1] or first.shape[1] > page:
        return True
    for t in tensors:  # FlexKV's read of every block its layout declares (shape[0]) must be the block itself
        if any(_reads(t, b) != t[b].contiguous().numpy().tobytes() for b in range(t.shape[0])):
            return True
    spans = {(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors}  # an alias: one span
    return any(a[0] < b[1] and b[0] < a[1] for a in spans for b in spans if a != b)


@given(indexer_dicts())
def test_indexer_entries_pass_exactly_when_flexkvs_arithmetic_reads_each_block(case):
    entries, blocks, page, faults = case
    expected_bad = _faulty(entries, blocks, page)
    try:
        check_indexer(entries, num_block=blocks, tokens_per_block=page)
    except AdapterError:
        assert expected_bad, f"refused a layout FlexKV reads right ({sorted(faults)})"
    else:
        assert not expected_bad, f"accepted a layout FlexKV misreads ({sorted(faults)})"


def test_a_strided_indexer_is_refused_with_the_arithmetic_it_breaks():
    tall = torch.zeros(10, 4, 3)
    with pytest.raises(AdapterError, match=r"indexer.k_cache.*not contiguous.*data_ptr \+ b x 4 x 3"):
        check_indexer({"model.layers.0.self_attn.indexer.k_cache": tall[::2]}, num_block=5, tokens_per_block=4)


def test_no_indexer_entries_is_nothing_to_check():
    check_indexer({}, num_block=0, tokens_per_block=0)


def test_the_entries_are_flexkvs_by_its_own_name_rule_and_vllms_one_head_views_are_squeezed():
    from flexkv_adapter.flexkv.vllm_indexer import indexer_entries

    one_head = torch.arange(5 * 64 * 4, dtype=torch.int16).view(5, 1, 64, 4)  # vLLM 0.33's [B, 1, N, C]
    two_heads = torch.zeros(5, 2, 64, 4)
    kv = {
        "model.layers.0.self_attn.attn": torch.zeros(5, 1, 64, 8),
        "model.layers.0.self_attn.indexer.k_cache": one_head,
        "model.layers.1.self_attn.indexer.k_cache.extra": two_heads,  # FlexKV's "in", not "endswith"
    }
    got = indexer_entries(kv)
    assert list(got) == ["model.layers.0.self_attn.indexer.k_cache", "model.layers.1.self_attn.indexer.k_cache.extra"]
    first = got["model.layers.0.self_attn.indexer.k_cache"]
    assert first.shape == (5, 64, 4) and first.data_ptr() == one_head.data_ptr() and torch.equal(first, one_head[:, 0])
    assert got["model.layers.1.self_attn.indexer.k_cache.extra"] is two_heads  # not squeezable: left to the check


@pytest.mark.parametrize(
    ("kv", "indexer", "accepted"),
    [
        (["model.layers.0.attn", "model.layers.1.attn"], ["model.layers.0.idx.k_cache", "model.layers.1.idx.k_cache"],
         True),
        (["layers.0", "layers.1"], ["layers.0.k_cache", "layers.1.k_cache"], True),  # a trailing index
        # a constant number before the index: the layer cannot be read (two integers), so it is refused
        (["model.0.layers.0.attn", "model.0.layers.1.attn"], ["model.0.layers.1.k_cache", "model.0.layers.0.k_cache"],
         False),
        (["model.layers.0.attn", "model.layers.1.attn"], ["model.layers.1.idx.k_cache", "model.layers.0.idx.k_cache"],
         False),  # reversed: layer 1's indexer would be restored into layer 0
        (["model.layers.0.attn", "model.layers.1.attn"], ["model.layers.0.idx.k_cache", "model.layers.0.x.k_cache"],
         False),  # one layer twice
    ],
)  # fmt: skip
def test_indexer_entries_are_paired_with_the_kv_layers_by_their_names(kv, indexer, accepted):
    main = {n: torch.zeros(4, 16, 8) for n in kv}
    entries = {n: torch.zeros(4, 16, 132, dtype=torch.uint8) for n in indexer}
    if accepted:
        check_indexer(entries, num_block=4, tokens_per_block=16, main=main)
        return
    with pytest.raises(InconsistentLayersError, match="FlexKV pairs them by position"):
        check_indexer(entries, num_block=4, tokens_per_block=16, main=main)
