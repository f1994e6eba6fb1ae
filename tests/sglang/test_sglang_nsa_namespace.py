"""The SGLang plugin: NSA/DSA head size by FlexKV's formula, and a stray ``flexkv`` folder.

SGLang 0.5.23's DSATokenToKVPool and ModelConfig are real; FlexKV is the stand-in of the conftest.
FlexKV sizes an NSA model's rows as ``kv_lora_rank + qk_rope_head_dim`` (bf16) or, for an fp8 KV
cache, ``kv_lora_rank + kv_lora_rank // 128 * 4 + qk_rope_head_dim * 2`` (FlexKVConfig, SGLang branch).
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import InconsistentLayersError
from flexkv_adapter.integrations.sglang.checks import _flexkv_fp8, _head_size

from . import flexkv_standin as fk
from .connectors import assert_registered_as_pool, build
from .pools import DSA_ARGS, mp


def _nsa(model):
    """The DeepSeek test model with an NSA indexer (index_head_dim), as DeepSeek-V3.2 configs have."""
    nsa = copy.copy(model)
    nsa.index_head_dim = 128
    return nsa


def test_an_nsa_pool_narrower_than_flexkvs_head_size_is_refused(sglang_env, models):
    sglang_env.use("old")
    sglang_env.load()
    narrow = mp().DSATokenToKVPool(**{**DSA_ARGS, "kv_lora_rank": 16})  # rows 16 + 8 against FlexKV's 24 + 8
    with pytest.raises(InconsistentLayersError, match="rows of 24 elements per head but FlexKV sizes its blocks"):
        build(narrow, _nsa(models["deepseek"]), page_size=narrow.page_size)
    assert not fk.calls("register_to_server")


def test_an_nsa_pool_of_flexkvs_head_size_is_registered(sglang_env, models):
    sglang_env.use("old")
    sglang_env.load()
    pool = mp().DSATokenToKVPool(**DSA_ARGS)
    build(pool, _nsa(models["deepseek"]), page_size=pool.page_size)
    assert_registered_as_pool([pool.kv_buffer], page_size=pool.page_size)


def test_flexkvs_nsa_formula_for_fp8_and_bf16():
    model = SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128, dtype=torch.bfloat16)
    assert _head_size(model, True, False) == 576
    assert _head_size(model, True, True) == 512 + 16 + 128  # 656 bytes: the fp8 row packs its scales
    assert _head_size(model, True, None) is None  # a FlexKV config file decides the dtype: not judged
    args = SimpleNamespace(kv_cache_dtype="fp8_e4m3")
    assert (
        _flexkv_fp8(model, args, {}) is True and _flexkv_fp8(model, SimpleNamespace(kv_cache_dtype="auto"), {}) is False
    )
    assert _flexkv_fp8(model, args, {"FLEXKV_KV_CACHE_DTYPE": "bf16"}) is False
    assert _flexkv_fp8(model, args, {"FLEXKV_CONFIG_PATH": "/x.yaml"}) is None


def test_a_flexkv_folder_in_the_launch_directory_is_not_flexkv(sglang_env, tmp_path, monkeypatch, caplog):
    (tmp_path / "flexkv").mkdir()  # a namespace package without any of FlexKV's modules
    (tmp_path / "flexkv" / "notes.txt").write_text("not FlexKV")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    caplog.set_level(logging.INFO)
    sglang_env.load()
    assert not sglang_env.registry._hooks
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") or r.exc_info]
    assert any("FlexKV is not installed; nothing to hook" in m for m in caplog.messages)
