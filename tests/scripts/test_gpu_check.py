"""scripts/gpu_check.py in CPU mode (CI has no GPU): it runs, passes, and its checks can fail."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import adapt

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_mode_runs_every_part_and_prints_json(tmp_path):
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--big-gib", "0.02", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(done.stdout)
    assert done.returncode == 0, result["failures"]
    assert done.stderr.splitlines()[-1] == "gpu_check: ok"  # the verdict, after the JSON
    assert result["ok"] and result["device"] == "cpu" and result["gpu"] is None
    assert json.loads(out.read_text()) == result
    assert len(result["pools"]) >= 15 and not any("error" in e for e in result["pools"].values())
    for entry in result["pools"].values():
        assert entry["zero_copy"]["tensors"] > 0 and not entry["zero_copy"]["failures"]
        eight, sixteen = entry["copy"]
        assert eight["chunks"] > 0 and eight["mismatches"] == eight["faults"] == 0
        assert sixteen["chunks"] + sixteen["unused"] == eight["chunks"] and sixteen["faults"] == 0
    refused = {name for name, e in result["pools"].items() if e["plan"].startswith("refused")}
    expected = {name for name, e in result["pools"].items() if e["plan_expected"].startswith("refused: ")}
    assert refused == expected and refused, "every plan() refusal says in the output why it is expected"
    share = result["share"]
    assert share["tensors"] > 0 and share["mismatched"] == [], share
    assert result["big_pool"]["bytes_copied"] == 0 and result["big_pool"]["adapt_s"] > 0


def _pool():
    k = [torch.randint(0, 100, (64, 2, 8), dtype=torch.int16) for _ in range(2)]
    v = [torch.randint(0, 100, (64, 2, 8), dtype=torch.int16) for _ in range(2)]
    return SimpleNamespace(k_buffer=k, v_buffer=v, page_size=16)


def test_the_block_copy_check_catches_a_misread_and_a_misaligned_base(gpu_check):
    pool = _pool()
    roots = gpu_check.roots(pool)
    view = adapt(pool)
    assert gpu_check.stride_blind_copy(view, roots, 8, False)["mismatches"] == 0
    strided = SimpleNamespace(page_size=16, num_blocks=2, tensors=lambda: [t[::2] for t in view.tensors()])
    assert gpu_check.stride_blind_copy(strided, roots, 8, False)["mismatches"] > 0  # FlexKV ignores strides
    shifted = SimpleNamespace(page_size=16, num_blocks=1, tensors=lambda: [raw_shift(pool.k_buffer[0])])
    assert gpu_check.stride_blind_copy(shifted, roots, 16, False)["faults"] == 1


def raw_shift(t: torch.Tensor) -> torch.Tensor:
    """The same allocation viewed 8 bytes in: 8- but not 16-byte aligned."""
    return t.view(-1)[4 : 4 + 16 * 2 * 8].view(16, 2, 8)


def test_the_zero_copy_check_catches_a_copy(gpu_check):
    pool = _pool()
    view = adapt(pool)
    assert gpu_check.check_zero_copy(view, gpu_check.roots(pool))["failures"] == []
    copied = SimpleNamespace(page_size=16, tensors=lambda: [t.clone() for t in view.tensors()])
    assert len(gpu_check.check_zero_copy(copied, gpu_check.roots(pool))["failures"]) == 4


def test_a_plan_outcome_other_than_the_samples_expectation_is_a_failure(gpu_check):
    module = gpu_check
    pool = {"zero_copy": {"failures": []}, "copy": [], "plan": "refused: PlanError: x", "plan_expected": "planned"}
    results = {"pools": {"p": pool}, "share": {"mismatched": []}, "big_pool": {}}
    assert module.failures(results) == ["p: plan() 'refused: PlanError: x', expected 'planned'"]
    pool["plan_expected"] = "refused: narrow V"
    assert module.failures(results) == []


def test_gpu_check_ends_with_a_verdict_line_that_counts_the_failures(gpu_check, monkeypatch, capsys):
    """The last line on stderr counts the JSON's failures list; the control is the CPU run above (ok)."""
    found = ["p: plan() 'refused: PlanError: x', expected 'planned'", "share: ['t0']"]
    monkeypatch.setattr(gpu_check, "run", lambda *_: {"failures": found, "ok": False})
    assert gpu_check.main(["--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["failures"] == found
    assert captured.err.splitlines()[-1] == "gpu_check: 2 failures"
    assert [gpu_check.verdict(f) for f in ([], ["a"], ["a", "b", "c"])] == ["ok", "1 failure", "3 failures"]
