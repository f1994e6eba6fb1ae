"""An unknown command or flag gets the did-you-mean every other input gets (real subprocesses)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flexkv_adapter.cli.main import build_parser, main
from flexkv_adapter.cli.parsing import suggest

EXE = Path(sys.executable).with_name("flexkv-adapter")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["doctr"], "invalid choice: 'doctr' (did you mean doctor?)"),
        (["insepct", "x.yaml"], "invalid choice: 'insepct' (did you mean inspect?)"),
        (["start_remote"], "invalid choice: 'start_remote' (did you mean start-remote?)"),
    ],
)
def test_an_unknown_subcommand_gets_a_did_you_mean(argv, hint):
    done = _run(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: flexkv-adapter ")
    assert f"flexkv-adapter: error: argument COMMAND: {hint}" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["demo", "--jsn"], "flexkv-adapter demo", "unrecognized arguments: --jsn (did you mean --json?)"),
        (
            ["doctor", "--requre-flexkv"],
            "flexkv-adapter doctor",
            "unrecognized arguments: --requre-flexkv (did you mean --require-flexkv?)",
        ),
        (
            ["doctor", "--confg=x.yaml"],
            "flexkv-adapter doctor",
            "unrecognized arguments: --confg=x.yaml (did you mean --config?)",
        ),
        (
            ["inspect", "x.yaml", "--jsno"],
            "flexkv-adapter inspect",
            "unrecognized arguments: --jsno (did you mean --json?)",
        ),
        (["--verbsoe", "demo"], "flexkv-adapter", "unrecognized arguments: --verbsoe (did you mean --verbose?)"),
    ],
)
def test_an_unknown_flag_gets_a_did_you_mean_from_its_own_commands_flags(argv, usage, hint):
    done = _run(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"usage: {usage} ["), done.stderr  # that command's usage, not the top one's
    assert f"{usage}: error: {hint}" in done.stderr, done.stderr


@pytest.mark.parametrize("argv", [["xyzzy"], ["demo", "--xyzzy"], ["demo", "extra"]])
def test_a_name_far_from_every_known_one_gets_no_guess(argv):
    done = _run(*argv)
    assert done.returncode == 2 and "did you mean" not in done.stderr, done.stderr


def test_the_right_spelling_is_accepted(capsys):
    """The control: the parser that suggests still parses what is right."""
    args = build_parser().parse_args(["-v", "doctor", "--json", "--require-flexkv", "--config", "x.yaml", "-v"])
    assert (args.command, args.json, args.require_flexkv, args.config) == ("doctor", True, True, "x.yaml")
    assert args.verbose + args.sub_verbose == 2
    assert main(["demo", "--json"]) == 0 and capsys.readouterr().err == ""


def test_suggest_reads_a_quoted_choice_and_leaves_other_messages_alone():
    actions = build_parser()._actions
    message = "argument COMMAND: invalid choice: \"do'ctor\" (choose from 'demo', 'doctor')"
    assert suggest(message, actions) == (
        "argument COMMAND: invalid choice: \"do'ctor\" (did you mean doctor?) (choose from 'demo', 'doctor')"
    )
    assert suggest("the following arguments are required: specs", actions) == (
        "the following arguments are required: specs"
    )
