"""Shared fixtures."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FAKE_FLEXKV = Path(__file__).parent / "fake_flexkv"


def _drop_flexkv_modules() -> None:
    for name in [m for m in sys.modules if m == "flexkv" or m.startswith("flexkv.")]:
        del sys.modules[name]


@pytest.fixture
def fake_flexkv(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Make the documented stand-in of FlexKV's pure-Python layout module importable."""
    _drop_flexkv_modules()
    monkeypatch.syspath_prepend(str(FAKE_FLEXKV))
    yield FAKE_FLEXKV
    _drop_flexkv_modules()


@pytest.fixture
def no_flexkv(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make ``import flexkv`` fail, whether or not FlexKV is installed."""
    _drop_flexkv_modules()
    monkeypatch.setitem(sys.modules, "flexkv", None)
    yield
    _drop_flexkv_modules()
