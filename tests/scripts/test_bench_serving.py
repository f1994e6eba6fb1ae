"""scripts/bench_serving.py: the serving table on docs/benchmark.md is its JSON, and the JSON has the issue's shape.

No timing is asserted here (timings belong to the benchmark); the engine parts run in their own
environments (``.venv-vllm``, ``.venv-sglang``) when the script is run.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "bench_serving.py"
DATA = ROOT / "docs" / "bench" / "serving.json"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def payload():
    return json.loads(DATA.read_text())


def test_benchmark_page_serving_table_is_the_committed_data(bench, payload):
    assert bench.markdown_table(payload) in (ROOT / "docs" / "benchmark.md").read_text()


def test_negative_control_a_changed_figure_is_not_on_the_benchmark_page(bench, payload):
    changed = copy.deepcopy(payload)
    changed["vllm"][1]["plugin_us"] += 1.0
    assert bench.markdown_table(changed) not in (ROOT / "docs" / "benchmark.md").read_text()


def test_committed_data_has_the_issue_shape(payload):
    assert not payload["quick"]
    assert [r["requests"] for r in payload["vllm"]] == [1, 64, 512, 4096]
    assert {r["what"] for r in payload["sglang"]} == {"bridge", "radix"}
    for row in payload["vllm"] + payload["sglang"]:
        assert {"requests", "baseline_us", "plugin_us", "ratio"} <= set(row)
        assert row["baseline_us"] > 0 and row["plugin_us"] > 0
        assert row["ratio"] == pytest.approx(row["plugin_us"] / row["baseline_us"], abs=0.002)
    for row in payload["vllm"]:
        assert row["no_connector_us"] > 0
    growth = payload["growth"]
    assert growth["finished"] >= 10_000 and growth["steps"] >= 2 * growth["window"] == 2000
    ratio = growth["last_vs_reference"] / growth["first_vs_reference"]
    assert payload["growth_ratio"] == pytest.approx(ratio, abs=0.002)


def test_goal_reads_ratio_from_64_requests_and_microseconds_below(bench):
    rows = [
        {"requests": 1, "baseline_us": 50.0, "plugin_us": 69.0, "ratio": 1.38},  # +19 us: met
        {"requests": 64, "baseline_us": 1000.0, "plugin_us": 1049.0, "ratio": 1.049},
    ]
    payload = {"vllm": rows, "sglang": rows, "growth_ratio": 1.0}
    assert bench.goal(payload) == {"vllm": True, "sglang": True, "growth": True}
    worse = copy.deepcopy(payload)
    worse["vllm"][0]["plugin_us"] = 71.0  # +21 us at 1 request
    worse["sglang"][1]["ratio"] = 1.06
    worse["growth_ratio"] = 1.2
    assert bench.goal(worse) == {"vllm": False, "sglang": False, "growth": False}


def test_goal_reads_sglang_ratios_from_64_requests_over_either_setup(bench):
    def row(what, n, base, plug, setup):
        ratio = plug / base
        return {"what": what, "requests": n, "baseline_us": base, "plugin_us": plug, "ratio": ratio, "flexkv": setup}

    standin = row("bridge", 64, 1000.0, 1049.0, "stand-in")  # the plugin's own cost over the stand-in: judged
    real = row("bridge", 64, 50000.0, 51950.0, "real KVManager")
    one = row("radix", 1, 75.0, 89.0, "stand-in")  # +14 us at one request: judged, met
    assert [bench.verdict(r) for r in (standin, real, one)] == [True, True, True]
    payload = {"vllm": [], "sglang": [standin, real, one], "growth_ratio": 1.0}
    assert bench.goal(payload)["sglang"]
    assert "| for scale |" not in bench.markdown_table(payload) and "| met |" in bench.markdown_table(payload)
    for i, setup in enumerate(("stand-in", "real KVManager")):
        slow = copy.deepcopy(payload)
        slow["sglang"][i]["ratio"] = 1.051  # a row from 64 requests over either setup: missed
        assert slow["sglang"][i]["flexkv"] == setup
        assert not bench.goal(slow)["sglang"] and "| **missed** |" in bench.markdown_table(slow)


def test_help_and_markdown_run_without_the_engines():
    run = [sys.executable, str(SCRIPT)]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True).stdout
    assert "--quick" in shown and "--markdown" in shown
    table = subprocess.run([*run, "--markdown", str(DATA)], capture_output=True, text=True, check=True).stdout
    assert table.startswith("| engine |") and "Growth:" in table


def test_a_part_that_fails_is_reported_with_its_error(bench, tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no engine here' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(SystemExit, match="the vllm part failed(.|\n)*no engine here"):
        bench.run_part("vllm", str(broken), quick=True)


def test_an_unknown_part_is_refused(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--parts", "trt", "--out", str(tmp_path)])
    assert "unknown part 'trt'" in capsys.readouterr().err
