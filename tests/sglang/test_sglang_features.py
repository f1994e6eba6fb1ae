"""The SGLang feature table against the installed SGLang 0.5.23: complete, and enforced on its real classes.

Completeness: every concrete subclass of ``KVCache`` and ``HostKVCache`` under ``sglang.srt`` (read from its
source, then imported: a module that fails to import fails the test, unless it is one whose missing
dependency cannot exist here, named below) is a row. The check runs against a table less one row as its
negative control. The page-interleave pools are built for real (only their NCCL communicator, which needs
a GPU, stood in) and refused; without their row adapt() serves them, and FlexKV's block 2 holds page 4.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import UnsupportedFeatureError, adapt
from flexkv_adapter.model.features import FeatureTable
from flexkv_adapter.model.sglang_features import OPTION, SGLANG
from flexkv_adapter.model.sglang_pool_features import POOL
from flexkv_adapter.readers import engine_objects

from ..engine_source import subclasses_in_source
from .pools import KW

ROOTS = ("KVCache", "HostKVCache")
# Modules that define pools but import what no CPU machine has: (the module that is missing), checked exactly.
CANNOT_IMPORT_HERE = {
    "sglang.srt.hardware_backend.mlx.model_runner_stub": "mlx",
    "sglang.srt.hardware_backend.npu.dsv4.dsv4_memory_pool": "torch_npu",
    "sglang.srt.mem_cache.storage.tensorcast_store.test_tensorcast_store": "tensorcast",
}


@functools.cache
def _source_classes() -> dict[str, str]:
    """Classes under sglang.srt whose base chain reaches KVCache or HostKVCache by name: name -> module."""
    import sglang

    return subclasses_in_source(Path(sglang.__file__).parent / "srt", "sglang.srt", ROOTS)


def defined_pool_classes() -> set[str]:
    """Every concrete pool class SGLang defines under sglang.srt (abstract ones cannot be built)."""
    names = set()
    for name, module in _source_classes().items():
        try:
            cls = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            if CANNOT_IMPORT_HERE.get(module) != exc.name:
                raise
            names.add(name)  # read from its source; it cannot be built here either
            continue
        if not inspect.isabstract(cls):
            names.add(name)
    return names


def unclassified(table: FeatureTable) -> list[str]:
    return sorted(n for n in defined_pool_classes() if table.get(n) is None)


def test_every_pool_class_sglang_defines_is_classified():
    assert unclassified(SGLANG) == []


@pytest.mark.parametrize("name", ["PageInterleaveMHATokenToKVPool", "MHATokenToKVPool", "DSV4NPUTokenToKVPool"])
def test_negative_control_a_table_less_one_pool_class_fails_the_completeness_check(name):
    assert unclassified(SGLANG.without(name)) == [name]


def test_the_walk_reaches_beyond_mem_cache_and_every_pool_row_names_a_class_sglang_defines():
    defined = defined_pool_classes()
    assert {"NPUMHATokenToKVPool", "_DummyKVCache", "MHATokenToKVPoolHost"} <= defined
    assert {r.name for r in SGLANG.of_kind(POOL)} <= defined


def test_every_option_row_names_a_field_of_sglangs_server_args():
    from sglang.srt.server_args import ServerArgs

    assert [r.trigger[0] for r in SGLANG.of_kind(OPTION) if r.trigger and not hasattr(ServerArgs, r.trigger[0])] == []


def page_interleave(monkeypatch, name: str):
    """SGLang's own page-interleave pool, shard rank 0 of 2, with its NCCL communicator stood in (no GPU)."""
    from sglang.srt.mem_cache import page_interleave_pool
    from sglang.srt.mem_cache.page_interleave import PageShardSpec

    monkeypatch.setattr(page_interleave_pool, "PyNcclCommunicator", lambda **kw: SimpleNamespace(**kw))
    spec = PageShardSpec(shard_rank=0, shard_size=2, page_size=16, max_prefix_tokens=64, chunk_tokens=32)
    group = SimpleNamespace(world_size=2, rank_in_group=0, cpu_group=None, device="cpu")
    shape = dict(head_num=2, head_dim=8) if "MHA" in name else dict(kv_lora_rank=24, qk_rope_head_dim=8)
    cls = getattr(page_interleave_pool, name)
    return cls(size=128, page_size=16, dtype=torch.bfloat16, layer_num=2, shard_spec=spec, shard_group=group,
               **shape, **KW)  # fmt: skip


def _write_pages(pool) -> None:
    """Logical page p's K rows set to p, through the pool's own set_kv_buffer (logical token ids)."""
    width = pool.k_buffer[0].shape[1:]
    for page in range(1, 5):
        rows = torch.full((16, *width), float(page), dtype=torch.bfloat16)
        pool.set_kv_buffer(SimpleNamespace(layer_id=0), torch.arange(page * 16, page * 16 + 16), rows, rows)


def test_page_interleave_pools_are_refused_because_their_rows_are_not_token_ids(monkeypatch):
    for name in ("PageInterleaveMHATokenToKVPool", "PageInterleaveMLATokenToKVPool"):
        with pytest.raises(UnsupportedFeatureError, match=f"{name} is a page-interleave pool.*not the engine's token"):
            adapt(page_interleave(monkeypatch, name))


def test_negative_control_without_its_row_a_page_interleave_pool_is_served_with_another_page_in_block_2(monkeypatch):
    pool = page_interleave(monkeypatch, "PageInterleaveMHATokenToKVPool")
    _write_pages(pool)
    mha = SGLANG.get("MHATokenToKVPool")
    assert mha is not None
    # the table as it stood before the class was classified: served like the MHA pool it subclasses
    rows = [
        dataclasses.replace(mha, name=r.name) if r.name == "PageInterleaveMHATokenToKVPool" else r for r in SGLANG.rows
    ]
    served = FeatureTable(SGLANG.engine, SGLANG.doc, tuple(rows))
    monkeypatch.setattr(engine_objects, "ENGINES", ((served, ("sglang.srt.",), POOL),))
    view = adapt(pool)
    block_2 = view.k_buffer[0][32:48]  # FlexKV reads block b at b * block bytes
    assert float(block_2[0, 0, 0]) == 4.0  # logical page 4, not page 2: wrong KV for every restore


def test_sglangs_placeholder_pool_is_refused():
    from sglang.srt.mem_cache.memory_pool import NoOpMHATokenToKVPool

    pool = NoOpMHATokenToKVPool(size=128, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2,
                                **KW)  # fmt: skip
    assert pool.k_buffer[0].shape[0] == 16  # one page for a pool of 128 tokens
    with pytest.raises(UnsupportedFeatureError, match="NoOpMHATokenToKVPool is a placeholder pool"):
        adapt(pool)


def _resolved(**kwargs):
    """SGLang's own ServerArgs, resolved as the engine resolves it at start (no model needed for these)."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="dummy", **kwargs)
    args.resolve_once()
    return args


def _prefill_cp():
    """DeepSeek's MLA prefill context parallelism as SGLang 0.5.23 resolves it (model_overrides/deepseek_v2.py
    205-210 declares attn_cp_size = tp): the raw field stays 1."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    args = _resolved(tp_size=8, enable_prefill_cp=True)
    declare_resolution(args, "deepseek_v2 MLA CP", attn_dp_size=1, dp_size=1, attn_cp_size=8)
    return args


def test_options_are_judged_as_sglang_resolved_them():
    from flexkv_adapter.integrations.sglang.refusals import option_refusal

    assert option_refusal(_resolved()) is None  # SGLang's defaults
    dp = _resolved(dp_size=2, enable_dp_attention=True)
    assert "attn_dp_size=2: --enable-dp-attention is DP attention" in str(option_refusal(dp))
    assert "attn_cp_size=8: --attn-cp-size" in str(option_refusal(_prefill_cp()))
    # SGLang turns the speculative stack off when aux hidden states are returned: nothing to refuse
    assert option_refusal(_resolved(speculative_algorithm="EAGLE3", enable_return_aux_hidden_states=True)) is None


def test_negative_control_the_raw_fields_miss_what_sglang_resolved(monkeypatch):
    from flexkv_adapter.integrations.sglang import refusals

    monkeypatch.setattr(refusals, "resolved", lambda args: args)  # read the fields as typed
    assert refusals.option_refusal(_prefill_cp()) is None  # context parallelism would be served
