"""Shared fixtures."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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


@pytest.fixture(autouse=True)
def _no_os_exit_in_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os._exit`` in the pytest process would end the run with status 0 and skip every later test.

    Forked children (multiprocessing) still exit for real: only the pytest process itself raises.
    """
    real_exit, pytest_pid = os._exit, os.getpid()

    def guarded(code: int) -> None:
        if os.getpid() == pytest_pid:
            raise AssertionError(f"os._exit({code}) called in the pytest process; run this path in a subprocess")
        real_exit(code)

    monkeypatch.setattr(os, "_exit", guarded)


# Property tests: 2,000 derandomized examples per strategy in CI ("ci", the default), fewer while
# iterating (HYPOTHESIS_PROFILE=dev). A test's own @settings(max_examples=...) still wins.
settings.register_profile(
    "ci", max_examples=2000, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# The engine tiers run in their own environments (scripts/test.sh runs each right after the main
# suite). Where a tier's engine is not installed at all, the tier is not collected and one line in
# the summary says so, instead of one SKIPPED line per test. Named on the command line, it is.
_TIERS = {"sglang": "scripts/install_sglang_cpu.sh", "vllm": "scripts/install_vllm_cpu.sh"}
_HERE = Path(__file__).parent
_left_out: list[str] = []


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    tier = collection_path.name
    if collection_path.parent != _HERE or tier not in _TIERS or importlib.util.find_spec(tier) is not None:
        return None
    asked = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if collection_path in asked:
        return None  # asked for by name: its own conftest skips each test, saying why
    if any(a == _HERE or a in _HERE.parents for a in asked) and tier not in _left_out:
        _left_out.append(tier)  # a run over the whole suite: say once that this tier was left out
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for tier in _left_out:
        terminalreporter.write_line(
            f"SKIPPED tests/{tier}: {tier} is not installed in this environment; "
            f"{_TIERS[tier]} installs it in its own (scripts/test.sh runs that tier there)"
        )
