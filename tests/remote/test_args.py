"""start_remote's command line (remote/args.py): a help page that fits a screen, required settings asked
for first, one line with a did-you-mean for a typo, and a last stderr line that says why it failed
(real subprocesses, each with its own ports and lock directory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.remote.args import FLAGS, RARE, build_parser
from flexkv_adapter.remote.exit_codes import ExitCode

from .harness import ROOT, SCRIPT, Remote, clean_env, free_ports, holding, run_once
from .test_dryrun import run


def _help() -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], env=clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _entry(text: str, flag: str) -> str:
    """The help entry of ``flag``: its line and the continuation lines under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(flag + " "))
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 10):
            break
        entry.append(line)
    return " ".join(" ".join(entry).split())


def test_help_fits_a_screen_in_groups_and_names_the_rarely_used_flags():
    text = _help()
    assert len(text.splitlines()) <= 50 and max(map(len, text.splitlines())) <= 100, text
    assert text.startswith("usage: start_remote.py --master-host HOST --nnodes N --node-rank RANK [options]")
    for group in ("required (", "deployment:", "health and files:", "timeouts, seconds:", "general:"):
        assert group in text
    assert text.index("--master-host HOST") < text.index("deployment:")  # the required settings come first
    rare = [flag for group, flag, *_ in FLAGS if group == RARE]
    assert rare and all(f"{flag} " not in text.split(RARE)[0] for flag in rare)  # not described above
    flat = " ".join(text.split())
    assert all(flag in flat.split(RARE)[1] for flag in [*rare, "--keep-cuda-visible-devices"])


def test_rarely_used_flags_are_still_accepted():
    args = build_parser().parse_args(["--reap-grace", "3", "--keep-cuda-visible-devices", "--master-lost", "7"])
    assert (args.reap_grace_s, args.keep_cuda_visible_devices, args.master_lost_s) == (3, True, 7)


def test_lock_dir_shows_one_default_and_the_required_settings_none():
    text = _help()
    lock = _entry(text, "--lock-dir")
    assert lock.count("default") == 1 and "$XDG_RUNTIME_DIR" in lock, lock
    for flag in ("--master-host", "--node-rank", "--nnodes"):
        entry = _entry(text, flag)
        assert "default" not in entry and "must not be 0" not in entry, entry
    assert "(default: 30.0)" in _entry(text, "--grace")  # a setting with a default still shows it


def test_a_bare_start_asks_for_the_master_address_first():
    code, line = run_once()
    assert code == ExitCode.SETTINGS and "master_host is unset" in line, line


def test_a_start_without_a_node_rank_asks_for_it_and_rank_0_is_still_refused():
    code, line = run_once("--master-host", "10.0.0.1", "--nnodes", "2")
    assert code == ExitCode.SETTINGS and "node_rank is unset" in line and "1..nnodes-1" in line, line
    code, line = run_once("--master-host", "10.0.0.1", "--nnodes", "2", "--node-rank", "0")
    assert code == ExitCode.NODE_RANK_ZERO and "node 0 runs" in line, line


@pytest.mark.parametrize(
    ("typo", "hint"),
    [
        ("--master-hots", "(did you mean --master-host?)"),
        ("--node-rnak=1", "(did you mean --node-rank?)"),
        ("--health-post", "(did you mean --health-host or --health-port?)"),  # equally near: both
        ("--zzz", ""),
        ("--master", "(did you mean --master-host"),  # no abbreviations: a prefix is not taken as a flag
    ],
)
def test_a_flag_typo_is_one_line_with_a_did_you_mean(typo, hint):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), typo], env=clean_env(), capture_output=True, text=True, timeout=30
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == ExitCode.SETTINGS and len(lines) == 1, done.stderr
    assert " ERROR start_remote: invalid command line: " in lines[0] and typo.split("=")[0] in lines[0]
    assert (hint in lines[0]) if hint else "did you mean" not in lines[0], lines[0]
    assert "usage:" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_health_host_is_refused_at_load_so_a_dry_run_cannot_pass(tmp_path, value):
    with pytest.raises(SettingsError) as raised:
        load_settings(health_host=value)
    assert raised.value.keys == ("health_host",) and "is empty" in str(raised.value)
    for extra in (["--dry-run"], []):  # the dry run and the real start give one answer
        code, _, err = run(tmp_path, *extra, health_host=value, health_port=free_ports(1)[0])
        assert code == ExitCode.SETTINGS and "health_host=" in err and "is empty" in err, err
    code, _, err = run(tmp_path, "--dry-run", health_host="127.0.0.1", health_port=free_ports(1)[0])
    assert code == ExitCode.OK, err  # the control: a real address passes


def test_after_a_failure_the_error_line_is_the_last_line(tmp_path):
    """The failed_visible_s window and the teardown log after the failure: the one error line comes
    after them, and the state line already gave the reason when it happened."""
    with holding() as busy:  # one master port accepts, the others do not: exit 10 after connect_timeout
        remote = Remote(tmp_path, ports=(busy, *free_ports(2)), connect_timeout=0.5, failed_visible=0.3)
        code, _, err = remote.finish(timeout=30)
    lines = err.strip().splitlines()
    errors = [line for line in lines if " ERROR start_remote: " in line]
    assert code == ExitCode.MASTER_UNREACHABLE and len(errors) == 1 and lines[-1] == errors[0], err
    reason = errors[0].split(" ERROR start_remote: ")[1]
    window = next(i for i, line in enumerate(lines) if "serving state failed for failed_visible_s=" in line)
    assert any(f"state: failed ({reason})" in line for line in lines[:window]), err  # said when it failed


def test_a_refusal_before_the_start_is_one_error_line_too(tmp_path):
    code, _, err = run(tmp_path, master_ports="5556,5556,5558")
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert code == ExitCode.BAD_PORTS and len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err


def test_the_docs_describe_every_flag_help_only_names():
    """--help names the rarely used flags; docs/start_remote.md's table says what each does."""
    docs = (ROOT / "docs" / "start_remote.md").read_text()
    rare = [(flag, dest) for group, flag, dest, *_ in FLAGS if group == RARE] + [
        ("--keep-cuda-visible-devices", "keep_cuda_visible_devices")
    ]
    for flag, dest in rare:
        assert any(line.startswith(f"| `{flag}") and f"| `{dest}` |" in line for line in docs.splitlines()), flag
