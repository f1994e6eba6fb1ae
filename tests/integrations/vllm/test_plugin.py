"""The vLLM plugin without vLLM: install() is a silent no-op; the spec reader refuses what FlexKV cannot address."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from flexkv_adapter import AdapterError, NotAddressableError, UnsupportedFeatureError
from flexkv_adapter.integrations.vllm.plugin import install, spec_facts


def test_install_without_vllm_is_a_silent_no_op(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with caplog.at_level(logging.DEBUG):
        assert install() is None
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)
    assert any("not installed" in r.getMessage() for r in caplog.records)


def test_the_entry_point_is_in_vllms_general_plugin_group():
    text = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    section = text.split('[project.entry-points."vllm.general_plugins"]\n', 1)[1].split("\n[", 1)[0]
    assert section.strip() == 'flexkv_adapter = "flexkv_adapter.integrations.vllm:install"'


@dataclass
class FullAttentionSpec:
    block_size: int = 16
    num_kv_heads: int = 2
    head_size: int = 64
    head_size_v: int | None = 64
    page_size_padded: int | None = None
    state_content_bytes: int | None = None
    num_head_slots: int | None = None
    tokens_per_state: object = 1


class MLAAttentionSpec(FullAttentionSpec):
    pass


# vLLM's spec classes by name and module (the main suite has no vLLM): the feature table decides them
FullAttentionSpec.__module__ = MLAAttentionSpec.__module__ = "vllm.v1.kv_cache_interface"


@dataclass
class Group:
    kv_cache_spec: object


@dataclass
class KVCacheConfig:
    kv_cache_groups: list


def test_spec_facts_take_the_kind_from_the_spec_type_and_the_cell_from_both_head_sizes():
    mha = spec_facts(KVCacheConfig([Group(FullAttentionSpec(head_size_v=32))]))
    assert mha == {"kind": "mha", "heads": 2, "content": 96, "block_size": 16}
    mla = spec_facts(KVCacheConfig([Group(MLAAttentionSpec(num_kv_heads=1, head_size=576, head_size_v=0))]))
    assert mla == {"kind": "mla", "heads": 1, "content": 576, "block_size": 16}


@pytest.mark.parametrize("field", ["page_size_padded", "state_content_bytes", "num_head_slots"])
def test_padded_or_quantized_pages_are_refused(field):
    spec = FullAttentionSpec(**{field: 4096})
    with pytest.raises(NotAddressableError, match=field):
        spec_facts(KVCacheConfig([Group(spec)]))


def test_several_cache_groups_are_refused():
    with pytest.raises(AdapterError, match="2"):
        spec_facts(KVCacheConfig([Group(FullAttentionSpec()), Group(FullAttentionSpec())]))


@pytest.mark.parametrize("ratio", [4, 8])
def test_compressed_states_are_refused_not_regrouped_as_kernel_blocks(ratio):
    """tokens_per_state > 1 (DeepSeek-V4, GLM-5-next, Step-5 summary caches): a [B, H, block/ratio, C] view.

    Read as kernel blocks of block/ratio tokens, plan_vllm would glue `ratio` manager blocks into one and
    FlexKV would serve block b's bytes for block b*ratio: refused at the spec instead.
    """
    from fractions import Fraction

    for tps in (ratio, Fraction(1, ratio)):
        spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, head_size_v=0, tokens_per_state=tps)
        with pytest.raises(NotAddressableError, match="tokens_per_state"):
            spec_facts(KVCacheConfig([Group(spec)]))


@dataclass
class MambaSpec:
    block_size: int = 16
    page_size_padded: int | None = None
    tokens_per_state: int = -1


MambaSpec.__module__ = "vllm.v1.kv_cache_interface"


def test_a_state_space_spec_is_refused_by_the_feature_table():
    with pytest.raises(UnsupportedFeatureError, match=r"MambaSpec\) is a state-space \(Mamba\) state.*docs/vllm.md"):
        spec_facts(KVCacheConfig([Group(MambaSpec())]))
