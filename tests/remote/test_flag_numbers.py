"""start_remote's numeric flags read their text by the environment's rule (ASCII decimal), one rule for text.

argparse's ``int``/``float`` took ``1_6``, ``\u0661\u0666`` (Arabic-Indic digits) and fullwidth digits as 16 on
the command line, while ``FLEXKV_ADAPTER_*`` variables refuse them: the same node configuration started from a
flag and from a variable gave two different answers.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.remote.cli import build_parser

from ..strategies.integers import env_texts

BASE = {"FLEXKV_MASTER_HOST": "10.0.0.1", "FLEXKV_ADAPTER_NNODES": "2", "FLEXKV_ADAPTER_NODE_RANK": "1"}
# flag, settings field, environment variable
NUMERIC = [
    ("--node-rank", "node_rank", "FLEXKV_ADAPTER_NODE_RANK"),
    ("--health-port", "health_port", "FLEXKV_ADAPTER_HEALTH_PORT"),
    ("--grace", "grace_s", "FLEXKV_ADAPTER_GRACE_S"),
    ("--failed-visible", "failed_visible_s", "FLEXKV_ADAPTER_FAILED_VISIBLE_S"),
]


def _outcome(load) -> object:
    try:
        return ("value", load())
    except SettingsError as exc:
        return ("refused", sorted(exc.keys))


def _from_flag(monkeypatch: pytest.MonkeyPatch, flag: str, dest: str, text: str) -> object:
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args([f"{flag}={text}"])
    return _outcome(lambda: getattr(load_settings(None, **{dest: getattr(args, dest)}), dest))


def _from_env(monkeypatch: pytest.MonkeyPatch, env: str, dest: str, text: str) -> object:
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(env, text)
    return _outcome(lambda: getattr(load_settings(None), dest))


@pytest.mark.parametrize(("flag", "dest", "env"), NUMERIC)
@settings(max_examples=60, deadline=None)
@given(text=env_texts() | st.sampled_from(["\u0661\u0666", "\uff11\uff16", "1_6", "16.0", "1e1", "inf", ".5"]))
def test_a_flag_and_its_variable_read_the_same_text_alike(flag, dest, env, text):
    if text.startswith("-") or not text.strip():
        return  # argparse reads "-..." as an option and an empty value differently: not a number question
    with pytest.MonkeyPatch.context() as mp:
        via_flag = _from_flag(mp, flag, dest, text)
    with pytest.MonkeyPatch.context() as mp:
        via_env = _from_env(mp, env, dest, text)
    assert via_flag == via_env, (text, via_flag, via_env)


@pytest.mark.parametrize("text", ["1_6", "\u0661\u0666", "\uff11\uff16"])
def test_exotic_digits_in_an_integer_flag_are_refused(monkeypatch, text):
    assert _from_flag(monkeypatch, "--health-port", "health_port", text) == ("refused", ["health_port"])


def test_plain_decimal_flags_still_read(monkeypatch):
    assert _from_flag(monkeypatch, "--health-port", "health_port", "8099") == ("value", 8099)
    assert _from_flag(monkeypatch, "--grace", "grace_s", "2.5") == ("value", 2.5)
