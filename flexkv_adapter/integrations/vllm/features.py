"""vLLM's side of the feature table, checked at engine start: spec types, groups and options.

Every KV cache spec vLLM hands the connector (each group's, and each layer's inside
``UniformTypeKVCacheSpecs``) is looked up by its class in :data:`~flexkv_adapter.model.vllm_features.VLLM`:
what the table does not serve is refused, an unnamed class (a user's subclass included) by default. Options
the table refuses are read off ``vllm_config`` when the connector is constructed, in both roles.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from ...errors import UnsupportedFeatureError
from ...model.features import table_name
from ...model.vllm_features import OPTION, RECOMPUTE_V2, SPEC, VLLM
from ...readers.containers import probe_path

PREFIXES = ("vllm.",)


def _spec_refusal(spec: Any, where: str) -> str | None:
    name = table_name(type(spec), PREFIXES)
    return VLLM.refusal(name, SPEC, where)


def check_specs(kv_cache_config: Any) -> None:
    """Refuse every group's spec, and every layer's spec of a uniform group, that the table does not serve."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    for i, group in enumerate(groups):
        spec = group.kv_cache_spec
        problem = _spec_refusal(spec, f"KV cache group {i}'s spec")
        per_layer = getattr(spec, "kv_cache_specs", None)
        if problem is None and isinstance(per_layer, Mapping):
            problem = next(
                (p for n, s in per_layer.items() if (p := _spec_refusal(s, f"layer {n}'s spec")) is not None), None
            )
        if problem is not None:
            raise UnsupportedFeatureError(f"flexkv_adapter: {problem}")


V1_GPU_RUNNER = "vllm.v1.worker.gpu_model_runner"  # vLLM 0.32, 0.33; 0.34 deleted it with the V1 runner


def _has_v1_gpu_runner() -> bool:
    try:
        return importlib.util.find_spec(V1_GPU_RUNNER) is not None
    except Exception:  # no vLLM to ask
        return False


def _v2_gpu_runner(vllm_config: Any) -> bool:
    """vLLM's V2 model runner on a GPU platform (vllm#49250 is in its update_requests, the same in 0.34); CPU runs
    the CPU runner. Where vLLM has no V1 GPU runner (0.34) every GPU run is the V2 runner, whatever the config says."""
    try:
        gpu = bool(importlib.import_module("vllm.platforms").current_platform.is_cuda_alike())
    except Exception:  # no vLLM platform to ask: not a GPU runner
        return False
    if gpu and not _has_v1_gpu_runner():
        return True
    try:
        return gpu and bool(getattr(vllm_config, "use_v2_model_runner", False))
    except Exception:  # the property raises for a configuration vLLM itself refuses
        return False


def check_options(vllm_config: Any) -> None:
    """Refuse the options the table refuses: every refused row with a trigger (read off ``vllm_config`` along its
    dotted path), and recompute on the V2 GPU model runner (a rule of two settings)."""
    if (found := VLLM.refused_and_on(OPTION, lambda setting: probe_path(vllm_config, setting))) is not None:
        row, setting, value, example = found
        shown = "set" if example is object else repr(value)
        raise UnsupportedFeatureError(f"flexkv_adapter ({setting}={shown}): {VLLM.refusal(row.name, OPTION)}")
    parallel = getattr(vllm_config, "parallel_config", None)
    index = getattr(parallel, "data_parallel_index", None)
    if isinstance(index, int) and not isinstance(index, bool) and index > 0:  # a dense model's DP rank: vLLM has
        # already made its data_parallel_size 1 (reconfigure_for_independent_dp_rank, v1/engine/core.py:1554)
        name = "--data-parallel-size"
        raise UnsupportedFeatureError(f"flexkv_adapter (data_parallel_index={index}): {VLLM.refusal(name, OPTION)}")
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    if getattr(transfer, "kv_load_failure_policy", None) == "recompute" and _v2_gpu_runner(vllm_config):
        raise UnsupportedFeatureError(f"flexkv_adapter: {VLLM.refusal(RECOMPUTE_V2, OPTION)}")


__all__ = ["check_options", "check_specs"]
