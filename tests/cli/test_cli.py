"""The demo: the main job, in-process and through the installed console script."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flexkv_adapter import __version__
from flexkv_adapter.cli.main import main
from flexkv_adapter.cli.samples import SAMPLES


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
    lines = out.splitlines()
    assert lines[0].split() == ["source", "view", "flexkv", "layers", "rows", "bytes"]
    assert "sglang MHA" in out and "MHA sglang-mha" in out and "refused [" in out
    assert max(map(len, lines)) <= 100
    assert "expected refusal, NotAddressableError:" in out  # the class is in the note a row points to


def test_demo_notes_give_each_long_explanation_once(capsys):
    assert main(["demo", "--json"]) == 0
    pools = json.loads(capsys.readouterr().out)["pools"]
    swa = "(sliding-window KV in swa_kv_pool"
    assert sum(json.dumps(p).count(swa) for p in pools) >= 4  # JSON keeps every error in full
    assert main(["demo"]) == 0
    notes = capsys.readouterr().out.partition("\nNotes")[2]
    first = re.findall(r"\n\[(\d+)\] ", notes[: notes.index(swa)])[-1]  # the note that gives it in full
    assert notes.count(swa) == 1 and "(as above)" in notes and f"(as in [{first}])" in notes


def test_once_points_later_notes_to_the_first_and_keeps_short_ones():
    from flexkv_adapter.cli.demo import once

    long = "(" + "x" * 60 + ")"
    notes = once([f"a {long} b {long} (short)", f"c {long} (short)", "d"])
    assert notes == [f"a {long} b (as above) (short)", "c (as in [1]) (short)", "d"]


@pytest.mark.parametrize("command", ["demo", "doctor", "inspect"])
def test_each_subcommand_help_starts_with_a_description(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    lines = capsys.readouterr().out.splitlines()
    description = lines[lines.index("") + 1]
    assert description[0].isupper() and description.endswith(".") and len(description) <= 100


def test_demo_gives_full_reasons_in_json_and_footnotes_and_keeps_expected_warnings_quiet(capsys, caplog):
    assert main(["demo", "--json"]) == 0
    captured = capsys.readouterr()
    pools = json.loads(captured.out)["pools"]
    ambiguous = next(p for p in pools if p["outcome"] == "AmbiguousLayoutError")
    assert "\n" in ambiguous["error"] and "Fix:" in ambiguous["error"]  # the readings and the fix, not line 1
    opted = [p for p in pools if "attention_only" in p["source"]]
    assert opted and all(p["warnings"] and p["warnings"][0]["level"] == "WARNING" for p in opted)
    assert not caplog.records  # expected, so not on the first-time user's screen (they are footnotes)
    assert main(["demo"]) == 0
    captured = capsys.readouterr()
    table, _, notes = captured.out.partition("\nNotes")
    marked = [line for line in table.splitlines() if re.search(r" \[\d+\] ", line)]
    unplanned = [p for p in pools if p["flexkv"] and not p["flexkv"]["registers"]]
    assert len(marked) == len(opted) + sum("error" in p for p in pools) + len(unplanned)
    numbers = {int(n) for line in marked for n in re.findall(r" \[(\d+)\] ", line)}  # a shared note, one number
    assert numbers == set(range(1, len(numbers) + 1)) and len(numbers) == len(marked) - len(unplanned) + 1
    assert all(f"\n[{n}] expected " in "\n" + notes.split("\n", 1)[1] for n in numbers)
    assert "Fix: pass axes=" in notes and "offloading attention layers" in notes
    assert not caplog.records


def test_demo_verbose_after_the_subcommand_shows_the_warnings(caplog):
    assert main(["demo", "-v"]) == 0
    assert any("offloading attention layers" in r.getMessage() for r in caplog.records)


def test_bare_command_prints_help_without_markup(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: flexkv-adapter") and "demo" in out and "doctor" in out
    assert "``" not in out


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"flexkv-adapter {__version__}"


def test_demo_fails_with_one_line_error_when_a_sample_misbehaves(capsys, monkeypatch):
    from flexkv_adapter.cli import demo, samples

    broken = samples.Sample("broken", lambda: object(), {"page_size": 16})
    monkeypatch.setattr(demo, "_samples", lambda: (broken,))
    assert main(["demo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: broken: expected adapted, got UnsupportedPoolError"]


def test_console_script_runs_the_demo():
    exe = Path(sys.executable).with_name("flexkv-adapter")
    assert exe.exists(), "the package must be installed with its console script"
    done = subprocess.run([exe, "demo", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


@pytest.mark.parametrize("argv", [["-v", "start-remote", "--help"], ["start-remote", "--help"]])
def test_start_remote_is_reached_with_or_without_a_leading_v(argv):
    # In a subprocess: start-remote ends with os._exit (threads blocked in FlexKV), which in-process
    # would end pytest itself with status 0 and skip every later test.
    code = f"from flexkv_adapter.cli.main import main; main({argv!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage: flexkv-adapter start-remote"), done.stderr


@pytest.mark.parametrize(
    "env",
    [{"FLEXKV_ADAPTER_HYBRID": "attention_only"}, {"FLEXKV_ADAPTER_CONFIG": "/nonexistent/flexkv.yaml"}],
)
def test_the_demo_shows_the_library_defaults_whatever_the_environment_holds(env, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["ignored_settings"] == sorted(env)
    assert main(["demo"]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().splitlines()[-1].startswith("The demo ran with the library's defaults; it ignored")
    assert all(name in text for name in env)
    assert {name: os.environ[name] for name in env} == env  # set back afterwards


def test_the_demo_without_settings_says_nothing_about_them(monkeypatch, capsys):
    for name in [k for k in os.environ if k.startswith("FLEXKV_ADAPTER_")]:
        monkeypatch.delenv(name)
    assert main(["demo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ignored_settings"] == []
