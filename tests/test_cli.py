"""The demo: the main job, in-process and through the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flexkv_adapter.cli import main
from flexkv_adapter.samples import SAMPLES


def test_demo_adapts_every_supported_kind_and_refuses_the_rest(capsys):
    assert main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    assert len(out["pools"]) == len(SAMPLES)
    for row, sample in zip(out["pools"], SAMPLES):
        assert row["outcome"] == (sample.refused_with or "adapted"), row
        if "report" in row:
            assert row["report"]["bytes_copied"] == 0 and row["report"]["bytes_aliased"] > 0


def test_demo_table(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["source", "recognizer"]
    assert "sglang MHA" in out and "refused: NotAddressableError" in out


def test_demo_fails_with_one_line_error_when_a_sample_misbehaves(capsys, monkeypatch):
    from flexkv_adapter import cli, samples

    broken = samples.Sample("broken", lambda: object(), {"page_size": 16})
    monkeypatch.setattr(cli, "_samples", lambda: (broken,))
    assert main(["demo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: broken: expected adapted, got UnsupportedPoolError"]


def test_console_script_runs_the_demo():
    exe = Path(sys.executable).with_name("flexkv-adapter")
    assert exe.exists(), "the package must be installed with its console script"
    done = subprocess.run([exe, "demo", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
