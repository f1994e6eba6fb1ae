"""vLLM's spec types and options, decided by the feature table at engine start (vLLM's classes built by name)."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from flexkv_adapter import UnsupportedFeatureError
from flexkv_adapter.integrations.vllm import features
from flexkv_adapter.model.vllm_features import OPTION, SPEC, VLLM

MODULE = "vllm.v1.kv_cache_interface"


def spec(name: str, module: str = MODULE, **attrs: Any) -> Any:
    return type(name, (), {"__module__": module, **attrs})()


@dataclass
class Group:
    kv_cache_spec: Any


@dataclass
class Config:
    kv_cache_groups: list = field(default_factory=list)


@pytest.mark.parametrize("row", VLLM.of_kind(SPEC), ids=lambda r: r.name)
def test_every_spec_type_is_served_or_refused_as_its_row_says(row):
    config = Config([Group(spec(row.name))])
    if row.verdict == "served":
        features.check_specs(config)
        return
    with pytest.raises(UnsupportedFeatureError, match=rf"group 0's spec \({row.name}\) is .*docs/vllm.md#features"):
        features.check_specs(config)


def test_an_unnamed_spec_type_and_a_users_subclass_are_refused_by_default():
    with pytest.raises(UnsupportedFeatureError, match=r"NewWindowSpec\) is a KV cache spec of vLLM.*not classified"):
        features.check_specs(Config([Group(spec("NewWindowSpec"))]))
    full = type(spec("FullAttentionSpec"))
    mine = type("FullAttentionSpec", (full,), {"__module__": "my_models.specs"})()
    with pytest.raises(UnsupportedFeatureError, match=r"my_models\.specs\.FullAttentionSpec\) is a KV cache spec"):
        features.check_specs(Config([Group(mine)]))


def test_a_uniform_group_is_decided_layer_by_layer():
    layers = {"model.layers.0.attn": spec("MLAAttentionSpec"), "model.layers.1.attn": spec("SlidingWindowMLASpec")}
    with pytest.raises(UnsupportedFeatureError, match=r"layer model.layers.1.attn's spec \(SlidingWindowMLASpec\)"):
        features.check_specs(Config([Group(spec("UniformTypeKVCacheSpecs", kv_cache_specs=layers))]))
    del layers["model.layers.1.attn"]  # negative control: the same group without the sliding-window layer
    features.check_specs(Config([Group(spec("UniformTypeKVCacheSpecs", kv_cache_specs=layers))]))


def test_speculative_decoding_is_refused_at_start():
    with pytest.raises(UnsupportedFeatureError, match="speculative decoding.*docs/vllm.md#features"):
        features.check_options(SimpleNamespace(speculative_config=object()))
    features.check_options(SimpleNamespace(speculative_config=None))


@pytest.mark.parametrize(("policy", "v2_gpu", "refused"), [("recompute", True, True), ("recompute", False, False),
                                                          ("fail", True, False)])  # fmt: skip
def test_recompute_is_refused_on_the_v2_gpu_model_runner_only(monkeypatch, policy, v2_gpu, refused):
    monkeypatch.setattr(features, "_v2_gpu_runner", lambda config: v2_gpu)
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_load_failure_policy=policy))
    if not refused:
        features.check_options(config)
        return
    with pytest.raises(UnsupportedFeatureError, match=r"vllm#49250.*VLLM_USE_V2_MODEL_RUNNER=0"):
        features.check_options(config)


def test_without_vllm_no_runner_is_a_gpu_runner():
    assert features._v2_gpu_runner(SimpleNamespace(use_v2_model_runner=True)) is False


@pytest.mark.parametrize(
    ("v1_runner", "setting", "v2"), [(False, None, True), (True, False, False), (True, True, True)]
)
def test_on_a_gpu_without_vllms_v1_runner_every_run_is_the_v2_runner(monkeypatch, v1_runner, setting, v2):
    """vLLM 0.34 deleted the V1 GPU runner (and use_v2_model_runner): recompute is refused there on any GPU config;
    where the V1 runner exists (0.32, 0.33) the config's choice decides (negative control)."""
    gpu = SimpleNamespace(current_platform=SimpleNamespace(is_cuda_alike=lambda: True))
    real = importlib.import_module
    monkeypatch.setattr(
        features.importlib, "import_module", lambda name: gpu if name == "vllm.platforms" else real(name)
    )
    monkeypatch.setattr(features, "_has_v1_gpu_runner", lambda: v1_runner)
    config = SimpleNamespace() if setting is None else SimpleNamespace(use_v2_model_runner=setting)
    assert features._v2_gpu_runner(config) is v2


TRIGGERED = [r for r in VLLM.of_kind(OPTION) if r.verdict == "refused" and r.trigger]


def _config(path: str, value: Any) -> Any:
    """A vllm_config-shaped object with ``value`` at the dotted ``path`` (and nothing else set)."""
    head, _, rest = path.partition(".")
    return SimpleNamespace(**{head: _config(rest, value) if rest else value})


@pytest.mark.parametrize("row", TRIGGERED, ids=lambda r: r.name)
def test_every_refused_option_with_a_setting_is_refused_at_start(row):
    setting, example = row.trigger
    on = object() if example is object else example
    with pytest.raises(UnsupportedFeatureError, match=rf"\({setting}=.*\): {re.escape(row.name)} is "):
        features.check_options(_config(setting, on))
    off = None if example is object else (1 if isinstance(example, int) else None)
    features.check_options(_config(setting, off))  # negative control: the same setting off starts


def test_parallelism_other_than_tensor_parallelism_is_refused():
    assert {r.trigger[0] for r in TRIGGERED} >= {
        "parallel_config.pipeline_parallel_size",
        "parallel_config.decode_context_parallel_size",
        "parallel_config.prefill_context_parallel_size",
        "parallel_config.data_parallel_size",
    }


@pytest.mark.parametrize(("index", "refused"), [(0, False), (1, True), (3, True), (None, False)])
def test_a_dense_models_data_parallel_rank_is_refused_by_its_index(index, refused):
    """vLLM makes a dense model's DP rank a world of one (data_parallel_size 1) before the connector is built;
    its data_parallel_index still says which rank it is."""
    config = _config("parallel_config.data_parallel_index", index)
    if not refused:
        features.check_options(config)
        return
    with pytest.raises(UnsupportedFeatureError, match=f"data_parallel_index={index}.*--data-parallel-size is"):
        features.check_options(config)
