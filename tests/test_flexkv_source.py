"""tests/flexkv_source.py: the order FlexKV's Python is looked for in, and a wrong FLEXKV_SOURCE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import flexkv_source


def _tree(root: Path) -> Path:
    (root / "flexkv").mkdir(parents=True)
    (root / "flexkv" / "__init__.py").write_text("")
    (root / "flexkv" / "kvmanager.py").write_text("")
    return root


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No FLEXKV_SOURCE, no installed flexkv, no shared copy: each test adds one."""
    monkeypatch.delenv("FLEXKV_SOURCE", raising=False)
    monkeypatch.setattr(flexkv_source, "SHARED", tmp_path / "no-shared")
    monkeypatch.setattr(flexkv_source, "_installed", lambda: None)
    return tmp_path


def test_flexkv_source_wins_over_the_shared_copy(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flexkv_source, "SHARED", _tree(nowhere / "shared"))
    monkeypatch.setenv("FLEXKV_SOURCE", str(_tree(nowhere / "mine")))
    found = flexkv_source.find()
    assert (found.root, found.how) == ((nowhere / "mine").resolve(), "FLEXKV_SOURCE")


def test_an_installed_flexkv_wins_over_the_shared_copy(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flexkv_source, "SHARED", _tree(nowhere / "shared"))
    monkeypatch.setattr(flexkv_source, "_installed", lambda: nowhere / "site")
    assert flexkv_source.find().how == "installed flexkv"


def test_the_shared_copy_is_the_last_resort(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flexkv_source, "SHARED", _tree(nowhere / "shared"))
    found = flexkv_source.find()
    assert found.root == (nowhere / "shared").resolve() and not found.skip_reason


def test_no_flexkv_gives_a_skip_reason_that_says_how_to_point_at_one(nowhere: Path) -> None:
    found = flexkv_source.find()
    assert found.root is None
    assert "FLEXKV_SOURCE" in found.skip_reason and "checkout" in found.skip_reason
    assert found.summary().startswith("not found")


@pytest.mark.parametrize("given", ["absent", "empty folder", "flexkv without kvmanager.py"])
def test_a_wrong_flexkv_source_is_an_error_not_a_fall_back(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.setattr(flexkv_source, "SHARED", _tree(nowhere / "shared"))
    root = nowhere / "given"
    if given != "absent":
        (root / "flexkv").mkdir(parents=True)
    if given == "flexkv without kvmanager.py":
        (root / "flexkv" / "__init__.py").write_text("")
    monkeypatch.setenv("FLEXKV_SOURCE", str(root))
    with pytest.raises(flexkv_source.FlexKVSourceError, match="FLEXKV_SOURCE"):
        flexkv_source.find()


def test_a_stand_in_under_tests_is_not_taken_for_an_installed_flexkv(fake_flexkv: Path) -> None:
    import flexkv  # noqa: F401  (the stand-in, from tests/fake_flexkv)

    assert flexkv_source._installed() is None


def test_the_command_prints_a_line_for_the_shell(tmp_path: Path) -> None:
    given = _tree(tmp_path / "fk")
    out = subprocess.run(
        [sys.executable, "-m", "tests.flexkv_source"], capture_output=True, text=True, check=True,
        cwd=flexkv_source.REPO, env={"FLEXKV_SOURCE": str(given), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.stdout.splitlines() == [f"FLEXKV_SOURCE={given.resolve()}", f"# {given.resolve()} (FLEXKV_SOURCE)"]
    bad = subprocess.run(
        [sys.executable, "-m", "tests.flexkv_source"], capture_output=True, text=True,
        cwd=flexkv_source.REPO, env={"FLEXKV_SOURCE": str(tmp_path / "nope"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert bad.returncode == 2 and "FLEXKV_SOURCE" in bad.stderr
