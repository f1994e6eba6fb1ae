"""Which model runner a GPU run of the installed vLLM uses, as the plugin's recompute rule reads it (vllm#49250: the
V2 GPU runner recomputes a rejected load from a stale offset). vLLM 0.34 deleted the V1 runner, so on a GPU every
run is the V2 runner and ``kv_load_failure_policy=recompute`` is refused; the decision runs on vLLM's own config
with vLLM's CUDA platform enum swapped in (no GPU here)."""

from __future__ import annotations

import pytest

from flexkv_adapter import UnsupportedFeatureError
from flexkv_adapter.integrations.vllm import features

from .build import connector_config
from .test_vllm_kv_memory import _platform


def _recompute(tmp_path):
    config = connector_config(tmp_path, "mha3")
    config.kv_transfer_config.kv_load_failure_policy = "recompute"
    return config


def test_on_a_gpu_without_a_v1_runner_recompute_is_refused_on_vllms_own_config(tmp_path, monkeypatch):
    import vllm.platforms

    if features._has_v1_gpu_runner():
        pytest.skip("this vLLM has the V1 GPU runner (0.32, 0.33): its config chooses the runner")
    config = _recompute(tmp_path)
    monkeypatch.setattr(vllm.platforms, "_current_platform", _platform("cuda"))
    with pytest.raises(UnsupportedFeatureError, match=r"vllm#49250"):
        features.check_options(config)


def test_negative_control_on_cpu_the_same_config_starts(tmp_path, monkeypatch):
    import vllm.platforms

    config = _recompute(tmp_path)
    monkeypatch.setattr(vllm.platforms, "_current_platform", _platform("cpu"))
    features.check_options(config)
