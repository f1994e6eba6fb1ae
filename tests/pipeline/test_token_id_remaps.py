"""Pools whose buffers are not indexed by the engine's token ids are refused by name, sub-pools included:
HiSparse (the device holds a hot subset) and unified memory (views indexed by physical, kernel-facing ids).
Attribute stand-ins here; the SGLang tier builds the real classes (tests/sglang/test_sglang_token_id_remaps.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import UnsupportedPoolError, adapt

from ..gate.test_gate import both_refuse, minimax_like, mla_like


def test_a_unified_memory_pool_is_refused_naming_why():
    pool = mla_like(layers=1)
    pool._unified_buffer = SimpleNamespace(_raw=torch.zeros(16))
    both_refuse(pool, UnsupportedPoolError, "unified-memory pool.*virtual")
    assert adapt(mla_like(layers=1)).layer_ids == [0]  # the control


@pytest.mark.parametrize("mark", ["mapping", "register_mapping"])
def test_a_hisparse_main_pool_under_minimax_names_hisparse_not_row_counts(mark):
    pool = minimax_like([0, 1, 2], [1])
    if mark == "mapping":
        pool.main_pool.full_to_hisparse_device_index_mapping = torch.zeros(64, dtype=torch.int64)
    else:
        pool.main_pool.register_mapping = lambda full_to_hisparse_device_index_mapping: None
    both_refuse(pool, UnsupportedPoolError, r"main_pool \(SimpleNamespace\) is a HiSparse pool.*FlexKV")
