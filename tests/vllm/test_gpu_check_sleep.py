"""scripts/gpu_check_sleep.py (gpu_check part 5) on CPU: its comparison passes and can fail; CPU mode skips."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_check_sleep.py"


@pytest.fixture(scope="module")
def sleep():
    spec = importlib.util.spec_from_file_location("gpu_check_sleep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_same_memory_re_registers_identically(sleep):
    result = sleep.register_twice(sleep.vllm_kv_caches(torch.device("cpu")), lambda kept: kept)
    assert result["failures"] == [] and "LAYERFIRST" in result["layout"], result


def test_negative_control_memory_other_than_vllms_is_caught(sleep):
    copies = lambda kept: {n: t.clone() for n, t in kept.items()}  # noqa: E731
    failures = sleep.register_twice(sleep.vllm_kv_caches(torch.device("cpu")), copies)["failures"]
    assert any("moved" in f for f in failures) and any("does not address" in f for f in failures)


def test_without_cuda_the_check_says_why_it_skipped(sleep):
    result = sleep.sleep_check(torch.device("cpu"))
    assert result["failures"] == [] and "CUDA" in result["skipped"]
