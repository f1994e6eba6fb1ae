"""A number written in a YAML file is text, as an environment variable is: both must read it by one rule.

PyYAML's YAML 1.1 resolver read ``page_size: 020`` as 16 (octal) where ``FLEXKV_ADAPTER_PAGE_SIZE=020`` is
20, and took ``1_6``, ``0x10``, ``0b10000`` and ``0:16`` (base 60) as integers the environment refuses;
``align_timeout_s: 1e3`` stayed a string (refused) where the environment reads 1000 seconds.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flexkv_adapter import load_settings
from flexkv_adapter.errors import AdapterError

from ..strategies.integers import env_texts

FIELDS = {"page_size": "FLEXKV_ADAPTER_PAGE_SIZE", "align_timeout_s": "FLEXKV_ADAPTER_ALIGN_TIMEOUT_S"}
SPELLINGS = (
    "020", "0o20", "0x10", "0b10000", "1_6", "0:16", "1:00", "+16", "16", "1e3", "1E3", "1e+3", "1.5e1", ".5e1", "5.e1",
    "1_0.5", "1:00.5", ".5", "5.", "-1", "0", "00", ".inf", ".nan", "-.inf", "9" * 30, "60", "60.0", "6e5", "7e5",
)  # fmt: skip
YAML_SPELLINGS = st.sampled_from(SPELLINGS)


def _outcome(read: Any) -> tuple[str, object]:
    try:
        return "accepted", read()
    except AdapterError:
        return "refused", None


def _from_file(field: str, text: str) -> tuple[str, object]:
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="yaml-text-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{field}: {text}\n")
        return _outcome(lambda: getattr(load_settings(config_file=path), field))
    finally:
        Path(path).unlink()


def _from_env(field: str, text: str) -> tuple[str, object]:
    with mock.patch.dict(os.environ, {FIELDS[field]: text}):
        return _outcome(lambda: getattr(load_settings(), field))


def _plain(text: str) -> bool:
    try:  # only texts YAML keeps as one plain scalar (not "-", "", "a: b", "# ...")
        plain = yaml.safe_load(f"v: {text}")
    except (yaml.YAMLError, ValueError):  # PyYAML's int() of 5000 digits
        plain = None
    value = plain.get("v") if isinstance(plain, dict) else None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number or (isinstance(value, str) and value == text)


def _same(field: str, text: str) -> None:
    assert _from_file(field, text) == _from_env(field, text), text


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_every_yaml_1_1_number_spelling_reads_as_in_the_environment(field: str) -> None:
    for text in SPELLINGS:
        if _plain(text):
            _same(field, text)


@settings(max_examples=80, deadline=None)
@given(field=st.sampled_from(sorted(FIELDS)), text=YAML_SPELLINGS | env_texts())
def test_a_number_in_the_settings_file_is_read_as_the_environment_reads_it(field: str, text: str) -> None:
    assume(_plain(text.strip()))
    _same(field, text.strip())
