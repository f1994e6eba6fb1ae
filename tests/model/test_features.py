"""The feature tables: rows that say what they must, refusals that name the feature, proofs that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.model.features import Feature, FeatureTable, engine_class, table_name
from flexkv_adapter.model.sglang_features import SGLANG
from flexkv_adapter.model.vllm_features import VLLM

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"sglang": SGLANG, "vllm": VLLM}


def test_a_served_row_names_its_proof_and_negative_control():
    with pytest.raises(ValueError, match="proof and its negative control"):
        Feature("X", "k", "served", "r", proof="tests/a.py::test_a")


def test_a_refused_row_says_where_and_what_to_do_instead():
    with pytest.raises(ValueError, match="where it is refused"):
        Feature("X", "k", "refused", "r", instead="y")
    with pytest.raises(ValueError, match="verdict"):
        Feature("X", "k", "maybe", "r")  # type: ignore[arg-type]


def test_a_feature_is_classified_once():
    row = Feature("X", "k", "bypassed", "r")
    with pytest.raises(ValueError, match="classified twice"):
        FeatureTable("E", "doc", (row, row))


@given(st.text(min_size=1, max_size=40))
def test_whatever_a_table_does_not_name_is_refused_naming_it_and_the_table(name):
    for table in TABLES.values():
        if table.get(name) is None:
            message = table.refusal(name, "thing")
            assert message is not None and name in message and table.doc in message and "not classified" in message


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES)
def test_each_row_gets_the_refusal_its_verdict_says(table):
    for row in table.rows:
        message = table.refusal(row.name, row.kind, "Outer.attr")
        if row.verdict == "refused":
            assert message == f"Outer.attr ({row.name}) is {row.reason}. {row.instead} (refused: see {table.doc})"
        else:
            assert message is None


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES)
def test_every_proof_and_control_names_a_test_that_exists(table):
    """A served or bypassed row's proof is a real test: the file exists and defines the function."""
    missing = []
    for row in table.rows:
        for node in filter(None, (row.proof, row.control)):
            file, _, rest = node.partition("::")
            function = re.sub(r"\[.*\]$", "", rest)
            path = ROOT / file
            if not (path.is_file() and function in _test_functions(path)):
                missing.append(f"{row.name}: {node}")
    assert missing == []


def test_the_proof_check_catches_a_test_that_does_not_exist(tmp_path):
    """Negative control: a misspelled proof is not among the functions the check reads."""
    proof = SGLANG.get("MHATokenToKVPool").proof  # type: ignore[union-attr]
    file, _, function = proof.partition("::")
    assert function in _test_functions(ROOT / file) and function + "_x" not in _test_functions(ROOT / file)


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES)
def test_the_markdown_shows_every_row_once(table):
    text = table.markdown()
    for row in table.rows:
        assert text.count(f"| `{row.name}` | {row.verdict} |") == 1


def test_engine_classes_are_told_by_their_mro():
    engine = type("MHATokenToKVPool", (), {"__module__": "sglang.srt.mem_cache.memory_pool"})
    users = type("MHATokenToKVPool", (engine,), {"__module__": "my_serving.pools"})
    plain = type("MHATokenToKVPool", (), {"__module__": "my_serving.pools"})
    prefixes = ("sglang.srt.",)
    assert engine_class(engine, prefixes) and engine_class(users, prefixes) and not engine_class(plain, prefixes)
    # a user's subclass is not the engine's class, whatever its name: no table names it
    assert table_name(engine, prefixes) == "MHATokenToKVPool"
    assert table_name(users, prefixes) == "my_serving.pools.MHATokenToKVPool"


@pytest.mark.parametrize(
    ("value", "example", "on"),
    [
        (True, True, True), (False, True, False), (1, True, False),  # a flag: only True
        (2, 2, True), (1, 2, False), (True, 2, False), (None, 2, False),  # a size: above 1, never a bool
        ("file", "x", True), ("", "x", False), ("null", "x", False), ("None", "x", False), (3, "x", False),
        (object(), object, True), (None, object, False),  # an object given: anything but None
    ],
)  # fmt: skip
def test_a_setting_turns_its_feature_on_by_the_kind_of_value_that_does(value, example, on):
    from flexkv_adapter.model.features import turned_on

    assert turned_on(value, example) is on


def test_each_engine_package_shows_its_table_at_its_top():
    from flexkv_adapter.integrations import sglang, vllm

    assert sglang.FEATURES is SGLANG and vllm.FEATURES is VLLM
