"""One integer rule, every way in: the same hostile value gives the same page size (or start layer, or
block count) through every path, or the same refusal through every path.

Ways in: adapt() and plan() arguments, a vLLM 0.33 dict's page_size, load_settings() arguments, a YAML
settings file, the environment (text), a spec dict, a YAML spec file, a recogniser plugin, and
align_block_counts() (over a one-process gloo group).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import yaml
from hypothesis import given, settings

from flexkv_adapter import AdapterError, adapt, load_settings
from flexkv_adapter.config.yamlfile import EXPONENT_FLOAT
from flexkv_adapter.flexkv import plan
from flexkv_adapter.pipeline.align import align_block_counts

from ..readers.test_vllm_layout import views
from ..strategies.integers import ROWS, durations, env_texts, hostile_integers

RULE = {1: "must be a positive integer", 0: "must be a non-negative integer"}
SPEC = {"name": "ways", "kind": "mha", "attrs": ["k_buffer", "v_buffer"], "axes": "N H D"}


def _pool() -> SimpleNamespace:
    ks = [torch.randn(ROWS, 2, 4) for _ in range(2)]
    return SimpleNamespace(k_buffer=ks, v_buffer=[torch.randn(ROWS, 2, 4) for _ in range(2)])


def _vllm() -> dict[str, torch.Tensor]:
    return views("LBNHC", layers=2, blocks=ROWS, heads=1, tokens=1, content=8)  # MLA, one-token kernel blocks


def _yaml_plain(value: object) -> bool:
    return type(value) in (int, float, str, bool)


class _Dumper(yaml.SafeDumper):
    """Quotes the strings the adapter's loader reads as numbers ("1e3"), as YAML 1.1's dumper does not."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+.0123456789"))


def _file(data: dict[str, Any]) -> str:
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="ways-")
    with os.fdopen(fd, "w") as f:
        yaml.dump(data, f, Dumper=_Dumper)
    return path


def _plugin(spec: dict[str, Any]) -> Any:
    return mock.patch("flexkv_adapter.readers.plugins.recognizers", lambda: (("ways", lambda pool: spec),))


def _with_yaml(way: Any) -> Any:
    def run(value: object) -> Any:
        path = _file({"value": value})
        try:
            return way(path)
        finally:
            Path(path).unlink()

    return run


def _spec_file(field: str, value: object) -> Any:
    path = _file({**SPEC, field: value})
    try:
        return adapt(_pool(), spec=path)
    finally:
        Path(path).unlink()


def _settings_file(value: object) -> int | None:
    path = _file({"page_size": value})
    try:
        return load_settings(config_file=path).page_size
    finally:
        Path(path).unlink()


PAGE_SIZE_WAYS = {
    "adapt": lambda v: adapt(_pool(), page_size=v).page_size,
    "plan": lambda v: plan(_pool(), page_size=v).tokens_per_block,
    "vllm adapt": lambda v: adapt(_vllm(), page_size=v, kind="mla").page_size,
    "vllm plan": lambda v: plan(_vllm(), page_size=v, kind="mla").tokens_per_block,
    "load_settings": lambda v: load_settings(page_size=v).page_size,
    "spec dict": lambda v: adapt(_pool(), spec={**SPEC, "page_size": v}).page_size,
    "plugin": lambda v: _in_plugin("page_size", v).page_size,
}
PAGE_SIZE_YAML_WAYS = {  # values YAML can write
    "settings file": _settings_file,
    "spec file": lambda v: _spec_file("page_size", v).page_size,
}
START_WAYS = {
    "adapt": lambda v: adapt(_pool(), page_size=16, start_layer=v).layer_ids[0],
    "plan": lambda v: plan(_pool(), page_size=16, start_layer=v).layer_ids[0],
    "spec dict": lambda v: adapt(_pool(), page_size=16, spec={**SPEC, "start_layer": v}).layer_ids[0],
    "plugin": lambda v: _in_plugin("start_layer", v, 16).layer_ids[0],
    "align_block_counts": lambda v: align_block_counts({"num_cpu_blocks": v})["num_cpu_blocks"][1],
}


def _in_plugin(field: str, value: object, page_size: int | None = None) -> Any:
    with _plugin({**SPEC, "attrs": None, field: value}):  # the plugin names the tensors: no attrs= from us
        return adapt(SimpleNamespace(**vars(_pool())), page_size)


def _outcome(way: Any, value: object, minimum: int) -> tuple[str, object]:
    try:
        return "accepted", way(value)
    except AdapterError as exc:
        assert RULE[minimum] in str(exc), f"refused for another reason: {exc}"
        return "refused", RULE[minimum]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """align_block_counts is a collective: a one-process gloo group."""
    store = tmp_path_factory.mktemp("rdv") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _same_everywhere(ways: dict[str, Any], value: object, minimum: int) -> None:
    outcomes = {name: _outcome(way, value, minimum) for name, way in ways.items()}
    assert len(set(outcomes.values())) == 1, (value, outcomes)


@settings(max_examples=40, deadline=None)
@given(value=hostile_integers(minimum=1))
def test_a_page_size_is_read_the_same_way_through_every_way_in(value):
    ways = {**PAGE_SIZE_WAYS, **(PAGE_SIZE_YAML_WAYS if _yaml_plain(value) else {})}
    _same_everywhere(ways, value, 1)


@settings(max_examples=40, deadline=None)
@given(value=hostile_integers(minimum=0))
def test_a_start_layer_and_a_block_count_are_read_by_the_same_rule(one_rank, value):
    _same_everywhere(START_WAYS, value, 0)


@settings(max_examples=60, deadline=None)
@given(text=env_texts())
def test_environment_text_is_an_integer_only_when_it_spells_one(text):
    """The environment holds text: ASCII decimal is its integer (as that integer passed as an argument),
    anything else is refused by the same rule that refuses ``"16"`` as an argument."""
    spelled = re.fullmatch(r"\s*[+-]?([0-9]+)\s*", text, re.ASCII)
    with mock.patch.dict(os.environ, {"FLEXKV_ADAPTER_PAGE_SIZE": text}):
        got = _outcome(lambda _: load_settings().page_size, None, 1)
    if spelled and len(spelled.group(1)) <= 20:
        assert got == _outcome(lambda v: load_settings(page_size=v).page_size, int(text), 1)
    else:
        assert got == ("refused", RULE[1])


@settings(max_examples=60, deadline=None)
@given(value=durations())
def test_the_align_timeout_setting_takes_what_align_takes(one_rank, value):
    """``align_timeout_s`` is what README passes to align_across_ranks: a setting that loads is a timeout
    the collective takes (it took up to 1e9 s, the collective 7 days), and the same values are refused."""
    ways = {
        "load_settings": lambda v: load_settings(align_timeout_s=v).align_timeout_s,
        "align_block_counts": lambda v: align_block_counts({"num_cpu_blocks": 4}, timeout=v) and float(v),
    }
    if _yaml_plain(value):
        ways["settings file"] = _with_yaml(lambda path: _settings_value(path, "align_timeout_s"))
    outcomes = {name: _seconds_outcome(way, value) for name, way in ways.items()}
    assert len(set(outcomes.values())) == 1, (value, outcomes)


def _settings_value(path: str, field: str) -> object:
    text = Path(path).read_text().replace("value:", f"{field}:")
    Path(path).write_text(text)
    return getattr(load_settings(config_file=path), field)


def _seconds_outcome(way: Any, value: object) -> tuple[str, object]:
    try:
        return "accepted", way(value)
    except AdapterError as exc:
        assert re.search("seconds in|less than or equal|greater than|not a number|finite|boolean", str(exc)), exc
        return "refused", None


def test_numpy_true_is_no_page_size_in_a_spec_or_the_settings():
    """The bug the property found: pydantic's int read numpy.True_ as 1 and 16.0 as 16."""
    import numpy as np

    with pytest.raises(AdapterError, match=RULE[1]):
        adapt(_pool(), spec={**SPEC, "page_size": np.True_})
    with pytest.raises(AdapterError, match=RULE[1]):
        load_settings(page_size=16.0)
