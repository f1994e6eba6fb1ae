"""The README and docs/ pages: every relative link and anchor resolves, and the benchmark table is its data."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_readme_first_screen_says_what_is_in_the_box():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for piece in ("adapt(pool)", "plan()", "register()", "SGLang", "vLLM", "start_remote", "flexkv-adapter"):
        assert piece in first_screen, piece
    assert "## Contents" in first_screen
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


def test_settings_page_names_every_setting():
    from flexkv_adapter.config.settings import AdapterSettings

    page = (ROOT / "docs" / "settings.md").read_text()
    missing = [f for f in AdapterSettings.model_fields if f"`{f}`" not in page]
    assert not missing, f"docs/settings.md does not name {missing}"


def test_benchmark_page_table_is_the_committed_data():
    spec = importlib.util.spec_from_file_location("bench_adapt", ROOT / "scripts" / "bench_adapt.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    table = bench.markdown_table(json.loads((ROOT / "docs" / "bench" / "bench.json").read_text()))
    assert table in (ROOT / "docs" / "benchmark.md").read_text()


def test_wheel_carries_what_the_readme_promises(tmp_path):
    """The package with py.typed, the console script, both engine plugins and the license."""
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools", minversion="68")  # the build backend pyproject.toml names
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("flexkv_adapter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"flexkv_adapter/py.typed", "flexkv_adapter/cli/main.py", "flexkv_adapter/cli/demo.py"} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for line in (
        "flexkv-adapter = flexkv_adapter.cli.main:main",
        "[sglang.srt.plugins]\nflexkv_adapter = flexkv_adapter.integrations.sglang:install",
        "[vllm.general_plugins]\nflexkv_adapter = flexkv_adapter.integrations.vllm:install",
    ):
        assert line in entry_points


def test_the_feature_tables_in_the_docs_are_the_codes():
    """docs/sglang.md and docs/vllm.md show the feature tables as generated from the code (scripts/feature_docs.py)."""
    spec = importlib.util.spec_from_file_location("feature_docs", ROOT / "scripts" / "feature_docs.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    for page, (table, source) in module.PAGES.items():
        text = (ROOT / page).read_text()
        assert module.rewritten(text, table, source) == text, f"{page} differs: run python scripts/feature_docs.py"
        assert module.rewritten(text.replace("| served |", "| refused |", 1), table, source) == text  # it would fix it
