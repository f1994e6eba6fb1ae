"""The demo's flexkv column: plan()'s verdict on each view adapt() gives, not only adapt()'s."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from flexkv_adapter.cli import demo, samples
from flexkv_adapter.cli.main import main
from flexkv_adapter.cli.samples import SAMPLES
from flexkv_adapter.errors import AdapterError
from flexkv_adapter.flexkv.plan import plan
from flexkv_adapter.pipeline.adapting import adapt

EXE = Path(sys.executable).with_name("flexkv-adapter")


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "demo", *args], capture_output=True, text=True, timeout=120)


def _cells(out: str) -> dict[str, list[str]]:
    """Each table row's cells, by source (columns are two or more spaces apart)."""
    lines = out.split("\nview: ")[0].splitlines()[2:]
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines)}


def test_demo_says_flexkv_cannot_register_the_narrow_v_views_and_gives_the_reason():
    done = _demo()
    assert done.returncode == 0, done.stderr
    cells, notes = _cells(done.stdout), done.stdout.partition("\nNotes")[2]
    refused = [s for s in SAMPLES if s.plan_refusal]
    assert [s.name for s in refused] == ["sglang MHA", "sglang MHA fp8 (uint8)", "sglang MHA, PP stage 2"]
    for sample in refused:
        view, verdict = cells[sample.name][1], cells[sample.name][2]
        assert verdict == "no: narrow V", cells[sample.name]
        number = re.search(r"\[(\d+)\]$", view).group(1)  # the row points to the full reason
        note = " ".join(notes.split(f"\n[{number}] ", 1)[1].split("\n[", 1)[0].split())
        assert note.startswith("expected plan() refusal (FlexKV cannot register this view), PlanError: head_dim 8")
        assert "so V would be misread" in note
    # the control: every other adapted sample registers, and says so
    planned = [s for s in SAMPLES if not s.plan_refusal and not s.refused_with]
    assert planned and all(cells[s.name][2] == "yes" for s in planned)
    assert all(cells[s.name][2] == "-" for s in SAMPLES if s.refused_with)  # no view, no verdict


def test_demo_json_carries_plan_verdict_as_plan_gives_it():
    done = _demo("--json")
    assert done.returncode == 0, done.stderr
    rows = {row["source"]: row for row in json.loads(done.stdout)["pools"]}
    for sample in SAMPLES:
        verdict = rows[sample.name]["flexkv"]
        if sample.refused_with:
            assert verdict is None
            continue
        try:
            plan(adapt(sample.build(), **sample.options))
        except AdapterError as exc:
            assert verdict == {
                "registers": False,
                "expected_registers": False,
                "short": "narrow V",
                "error": type(exc).__name__,
                "reason": str(exc),
            }
        else:
            assert verdict == {"registers": True, "expected_registers": True}, sample.name


def test_demo_fails_when_plan_refuses_a_view_its_sample_expects_to_register(capsys, monkeypatch):
    narrow = samples.Sample("narrow V, not expected", samples._mha_pool)
    monkeypatch.setattr(demo, "_samples", lambda: (narrow,))
    assert main(["demo"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == "error: narrow V, not expected: expected plan() to plan the view, got PlanError"
    assert "no: PlanError" in captured.out and "[1] UNEXPECTED plan() refusal" in captured.out
    expected = samples.Sample("narrow V, expected", samples._mha_pool, plan_refusal="narrow", plan_short="narrow V")
    monkeypatch.setattr(demo, "_samples", lambda: (expected,))
    assert main(["demo"]) == 0  # the control: the same pool with the refusal expected


def test_demo_fails_when_plan_registers_a_view_its_sample_expects_refused(capsys, monkeypatch):
    wide = samples.Sample("renamed, refusal expected", samples._renamed("k_cache", "v_cache"), plan_refusal="x")
    monkeypatch.setattr(demo, "_samples", lambda: (wide,))
    assert main(["demo"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == "error: renamed, refusal expected: expected plan() to refuse the view, it planned it"
    assert "UNEXPECTED: plan() planned this view" in captured.out
