"""Property: a settings or spec file gives a valid object or a SettingsError/AdapterError, nothing else.

Hypothesis writes hostile files (random YAML documents, wrong top-level types, booleans and huge or
non-finite numbers where counts go, tags, alias trees of any fan-out and depth, token soup, random
bytes, corrupted shipped files) and hands them to ``load_spec`` and ``load_settings``; the same
values also go in as Python objects (``load_spec(dict)``, ``load_settings(**overrides)``). Every
error must be one of the library's, bounded in size; every success must hold real numbers.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexkv_adapter import AdapterError
from flexkv_adapter.config.settings import AdapterSettings, load_settings
from flexkv_adapter.config.yamlfile import MAX_NODES
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.readers.spec import LayoutSpec, load_spec

EXAMPLES = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "2000")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SPEC_KEYS = sorted(LayoutSpec.model_fields)
SETTING_KEYS = sorted(AdapterSettings.model_fields)
SHIPPED = sorted((Path(__file__).parents[2] / "configs").rglob("*.yaml"))
MAX_MESSAGE = 4000
_counter = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def clean_env():
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("FLEXKV_"):
                mp.delenv(key)
        yield


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


def _write(folder: Path, content: bytes) -> Path:
    path = folder / f"f{next(_counter) % 8}.yaml"
    path.write_bytes(content)
    return path


def _numbers_are_numbers(model: Any) -> None:
    for name, value in model:
        if isinstance(value, bool):
            assert type(model).model_fields[name].annotation in (bool, bool | None), (name, value)
        if isinstance(value, float):
            assert math.isfinite(value), (name, value)


def check_spec(source: Any) -> None:
    try:
        spec = load_spec(source)
    except AdapterError as exc:
        assert len(str(exc)) < MAX_MESSAGE, len(str(exc))
        if isinstance(source, Path):
            assert str(source) in str(exc)
    else:
        assert isinstance(spec, LayoutSpec)
        _numbers_are_numbers(spec)
        assert spec.layer_ids is None or not any(isinstance(i, bool) for i in spec.layer_ids)


def check_settings(path: Path | None = None, **overrides: Any) -> None:
    try:
        s = load_settings(path, **overrides)
    except SettingsError as exc:
        assert len(str(exc)) < MAX_MESSAGE, len(str(exc))
        if path is not None and "invalid settings" not in str(exc):
            assert str(path) in str(exc)
    else:
        assert isinstance(s, AdapterSettings)
        _numbers_are_numbers(s)


def check_file(folder: Path, content: bytes) -> None:
    path = _write(folder, content)
    check_spec(path)
    check_settings(path)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["yes", "no", "on", "off", "16", "0x10", "1e3", ".nan", "-.inf", "0.0.0.0", "::", "N H D"]),
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6,
)
keys = st.sampled_from(SPEC_KEYS + SETTING_KEYS) | st.text(max_size=12)
documents = st.one_of(
    st.dictionaries(keys, values, max_size=6),  # the expected shape with hostile values
    st.fixed_dictionaries(
        {"name": st.text(max_size=10), "axes": st.sampled_from(["N H D", "L KV N H D", "KV P T H D"])},
        optional={k: values for k in SPEC_KEYS if k not in ("name", "axes")},
    ),
    values,  # lists and scalars at the top level
)


@EXAMPLES
@given(data=documents, flow=st.sampled_from([None, True, False]))
def test_random_yaml_documents(folder, data, flow):
    check_file(folder, yaml.dump(data, default_flow_style=flow, allow_unicode=True).encode())


@EXAMPLES
@given(data=st.dictionaries(st.sampled_from(SPEC_KEYS), values, max_size=4) | documents)
def test_random_spec_mappings(data):
    check_spec(data)


@EXAMPLES
@given(overrides=st.dictionaries(st.sampled_from(SETTING_KEYS), values, max_size=4))
def test_random_settings_arguments(overrides):
    check_settings(**overrides)


TOKENS = [
    "name: x\n", "axes: N H D\n", "page_size: ", "layer_ids: ", "master_host: ", "tp_size: ", "\n", "  ", "\t",
    "- ", ": ", "? ", "[", "]", "{", "}", ",", "&a ", "*a ", "&b ", "*b", "<<: ", "<<: *a\n", "---\n", "...\n",
    "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "!!python/object/apply:os.system ['true']", "!!python/name:os.system",
    "!!binary aGk=", "!!set {a}", "!!timestamp 2001-12-14", "!!int", "!!str", "!!float", "!local ", "yes", "true",
    "~", "null", ".nan", "-.inf", "0x1F", "0o17", "1_000", "9" * 30, '"\\x00"', "'", '"', "|\n  ", ">-\n  ",
    "# c\n", "\u00e9", "\U0001f600", "\ufeff", "\x85", "\u2028", "0.0.0.0",
]  # fmt: skip


@EXAMPLES
@given(parts=st.lists(st.sampled_from(TOKENS) | st.text(max_size=4), max_size=40))
def test_yaml_token_soup(folder, parts):
    check_file(folder, "".join(parts).encode("utf-8", "surrogatepass"))


@st.composite
def alias_trees(draw: st.DrawFn) -> tuple[str, int, bool]:
    """An anchored list, then levels each referring ``fan`` times to earlier anchors (or itself)."""
    fan, levels = draw(st.integers(1, 12)), draw(st.integers(1, 10))
    lines, weights = ["name: x", "axes: N H D", "a0: &a0 [" + ",".join(["lol"] * fan) + "]"], [1 + fan]
    recursive = False
    for level in range(1, levels):
        refs = draw(st.lists(st.integers(0, level), min_size=fan, max_size=fan))
        recursive |= level in refs
        body = ",".join(f"*a{r}" for r in refs)
        if draw(st.booleans()):
            lines.append(f"a{level}: &a{level} [{body}]")
        else:
            lines.append(f"a{level}: &a{level} {{" + ", ".join(f"k{i}: *a{r}" for i, r in enumerate(refs)) + "}")
        weights.append(1 + sum(weights[r] if r < level else 0 for r in refs) + (fan if lines[-1][-1] == "}" else 0))
    return "\n".join(lines) + "\n", sum(weights) + 2 * len(lines), recursive


@EXAMPLES
@given(tree=alias_trees())
def test_alias_trees_are_bounded(folder, tree):
    text, approx_nodes, recursive = tree
    path = _write(folder, text.encode())
    check_spec(path)
    check_settings(path)
    if recursive or approx_nodes > 2 * MAX_NODES:
        with pytest.raises(AdapterError, match="alias|contains it|nodes"):
            load_spec(path)


@EXAMPLES
@given(content=st.binary(max_size=600))
def test_random_bytes(folder, content):
    check_file(folder, content)


@EXAMPLES
@given(
    source=st.sampled_from(SHIPPED),
    edits=st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=3), st.integers(0, 3)), min_size=1, max_size=4),
)
def test_corrupted_shipped_files(folder, source, edits):
    data = bytearray(source.read_bytes())
    for where, insert, delete in edits:
        at = int(where * len(data))
        data[at : at + delete] = insert
    check_file(folder, bytes(data))
