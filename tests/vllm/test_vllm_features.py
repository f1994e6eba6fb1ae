"""The vLLM feature table against the installed vLLM (0.32, 0.33 or 0.34): complete, and enforced at engine start.

Completeness: every ``KVCacheSpec`` subclass vLLM defines, found by importing vLLM and by reading its source,
is a row; a new vLLM release with a new spec type turns this red instead of being served by default. The
check runs against a table less one row as its negative control.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import pytest
import torch

from flexkv_adapter import UnsupportedFeatureError
from flexkv_adapter.model.features import FeatureTable
from flexkv_adapter.model.vllm_features import SPEC, VLLM

from ..engine_source import subclasses_in_source
from .build import allocate, connector_config, spec_of
from .test_vllm_plugin import registrations, roles

ROOT_CLASS = "KVCacheSpec"
INDEXERS = [f"model.layers.{i}.self_attn.indexer.k_cache" for i in range(3)]  # one per layer
INDEXER = INDEXERS[0]


def _subclasses(cls: type) -> set[type]:
    found, stack = set(), [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


@functools.cache
def _source_classes() -> dict[str, str]:
    """Classes whose base chain reaches KVCacheSpec by name, read from every vLLM source file: name -> module."""
    import vllm

    return subclasses_in_source(Path(vllm.__file__).parent, "vllm", (ROOT_CLASS,), line=r".*Spec")


def defined_spec_types() -> set[str]:
    """Every spec type this vLLM defines: its source's classes (each module imported: a failure fails the
    test) and the subclasses its import registers."""
    from vllm.v1 import kv_cache_interface

    source = _source_classes()
    for module in sorted(set(source.values())):
        importlib.import_module(module)
    return set(source) | {c.__name__ for c in _subclasses(kv_cache_interface.KVCacheSpec)}


def unclassified(table: FeatureTable) -> list[str]:
    return sorted(name for name in defined_spec_types() if table.get(name) is None)


def test_every_kv_cache_spec_type_vllm_defines_is_classified():
    assert unclassified(VLLM) == []


@pytest.mark.parametrize("name", ["SlidingWindowSpec", "FullAttentionSpec", "UniformTypeKVCacheSpecs"])
def test_negative_control_a_table_less_one_spec_type_fails_the_completeness_check(name):
    assert unclassified(VLLM.without(name)) == [name]


def test_every_spec_row_names_a_type_this_vllm_defines():
    assert {r.name for r in VLLM.of_kind(SPEC)} <= defined_spec_types()


def test_a_sliding_window_model_is_refused_at_start_on_vllms_own_allocation(plugged, tmp_path):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    window = SlidingWindowSpec(block_size=16, num_kv_heads=3, head_size=8, dtype=torch.bfloat16, sliding_window=32)
    _, kv_cache_config, _ = allocate("LBNHC", "mha3", spec=window)
    for role in (roles().SCHEDULER, roles().WORKER):
        with pytest.raises(UnsupportedFeatureError, match=r"\(SlidingWindowSpec\) is a sliding-window group.*null"):
            plugged(connector_config(tmp_path, "mha3"), role, kv_cache_config)
    assert registrations() == []
    _, full, _ = allocate("LBNHC", "mha3")  # negative control: the same model with full attention starts
    plugged(connector_config(tmp_path, "mha3"), roles().SCHEDULER, full)


def _uniform(kv_cache_config, indexer_spec):
    """The MLA group as vLLM groups an MLA model with its DeepSeek-V3.2 indexer: one UniformTypeKVCacheSpecs."""
    import dataclasses

    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    group = kv_cache_config.kv_cache_groups[0]
    layers = {name: group.kv_cache_spec for name in group.layer_names} | dict.fromkeys(INDEXERS, indexer_spec)
    uniform = UniformTypeKVCacheSpecs.from_specs(layers) or UniformTypeKVCacheSpecs(
        block_size=group.kv_cache_spec.block_size, kv_cache_specs=layers
    )
    groups = [dataclasses.replace(group, kv_cache_spec=uniform, layer_names=[*group.layer_names, *INDEXERS])]
    return dataclasses.replace(kv_cache_config, kv_cache_groups=groups), uniform


def test_a_uniform_group_of_mla_and_its_indexer_is_registered_whole(plugged, tmp_path):
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, UniformTypeKVCacheSpecs

    kv_caches, kv_cache_config, _ = allocate("LBNHC", "mla")
    indexer_spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8)
    config, uniform = _uniform(kv_cache_config, indexer_spec)
    assert type(uniform) is UniformTypeKVCacheSpecs and UniformTypeKVCacheSpecs.is_uniform_type(uniform.kv_cache_specs)
    vllms = list(allocate("LBNHC", "mla", layers=3, spec=indexer_spec)[0].values())
    kv_caches.update(zip(INDEXERS, vllms))
    worker = plugged(connector_config(tmp_path, "mla"), roles().WORKER, config)
    worker.register_kv_caches(kv_caches)
    (sent,) = registrations()
    main, indexer = sent["handles_per_group"]
    assert len(main) == 3 and [t.data_ptr() for t in indexer] == [t.data_ptr() for t in vllms]
    assert all(torch.equal(got, view[:, 0]) for got, view in zip(indexer, vllms))


def test_a_uniform_group_with_one_sliding_window_layer_is_refused(plugged, tmp_path):
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    _, kv_cache_config, _ = allocate("LBNHC", "mla")
    window = SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=24, dtype=torch.bfloat16, sliding_window=64)
    config, _ = _uniform(kv_cache_config, window)
    with pytest.raises(UnsupportedFeatureError, match=rf"layer {INDEXER}'s spec \(SlidingWindowMLASpec\)"):
        plugged(connector_config(tmp_path, "mla"), roles().WORKER, config)
    assert registrations() == []


def test_the_spec_builder_is_vllms_own():
    assert type(spec_of("mha3")).__module__ == "vllm.v1.kv_cache_interface"


def test_every_option_trigger_is_a_setting_of_vllms_config_and_off_by_default():
    """Each trigger is a setting of this vLLM's config, off by default; a row a later vLLM added (SINCE) names a
    setting this vLLM lacks, or SINCE is wrong."""
    import vllm

    from flexkv_adapter.integrations.vllm.versions import version_problem
    from flexkv_adapter.model.features import turned_on
    from flexkv_adapter.model.vllm_features import OPTION, SINCE

    from .build import vllm_config

    assert version_problem(vllm.__version__) is None
    running = tuple(int(p) for p in vllm.__version__.split(".")[:2])
    config, missing, expected = vllm_config(), [], []
    for row in VLLM.of_kind(OPTION):
        if not row.trigger:
            continue
        if SINCE.get(row.name, (0, 0)) > running:
            expected.append(row.trigger[0])
        obj = config
        for part in row.trigger[0].split("."):
            if not hasattr(obj, part):
                missing.append(row.trigger[0])
                break
            obj = getattr(obj, part)
        else:
            assert not turned_on(obj, row.trigger[1]), row.name  # vLLM's default starts
    assert missing == expected
