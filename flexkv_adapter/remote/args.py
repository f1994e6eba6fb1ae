"""``start_remote``'s command line: flags in groups, the rarely used ones kept to docs/start_remote.md.

``--help`` fits a screen: the settings every node must give come first, then the common ones by
topic; the rarely used flags are accepted but only named in one line (their text is in the docs).
A command-line error is one ``ERROR start_remote:`` line with a did-you-mean, status 2.
"""

from __future__ import annotations

import argparse
import logging
import re
import textwrap
from collections.abc import Callable
from typing import NoReturn

from ..config.problems import did_you_mean
from ..config.settings import AdapterSettings
from ..config.strict import number_kind, number_text
from .exit_codes import MEANINGS, ExitCode

logger = logging.getLogger("flexkv_adapter.remote")

REQUIRED = "required (a flag, a FLEXKV_ADAPTER_*/FLEXKV_* variable or the --config file)"
RARE = "rarely used (docs/start_remote.md#command-line-and-settings)"

# (group, flag, settings field, metavar, help): flags win over every other source; a number is read from its
# text by the rule environment variables use (ASCII decimal), and any other text is left for the settings
FLAGS: tuple[tuple[str, str, str, str, str], ...] = (
    (REQUIRED, "--master-host", "master_host", "HOST", "node 0's address (FLEXKV_MASTER_HOST)"),
    (REQUIRED, "--nnodes", "nnodes", "N", "number of nodes, 2 or more"),
    (REQUIRED, "--node-rank", "node_rank", "RANK", "this node's rank, 1..nnodes-1 (node 0 runs the master)"),
    ("deployment", "--master-ports", "master_ports", "C,R,Q", "command,result,query ports (FLEXKV_MASTER_PORTS)"),
    ("deployment", "--server-recv-port", "server_recv_port", "IPC", "FlexKV's server socket, same on all nodes"),
    ("health and files", "--health-port", "health_port", "PORT", "health endpoint port (off unless set)"),
    ("health and files", "--health-host", "health_host", "HOST", "health endpoint address"),
    ("health and files", "--ready-file", "ready_file", "PATH", "file present (JSON) only while ready"),
    ("health and files", "--lock-dir", "lock_dir", "DIR", "existing directory of the one-remote-per-master lock"),
    ("timeouts, seconds", "--connect-timeout", "connect_timeout_s", "S", "for the master's ports"),
    ("timeouts, seconds", "--handshake-timeout", "handshake_timeout_s", "S", "for the master's config"),
    ("timeouts, seconds", "--gpu-timeout", "gpu_timeout_s", "S", "for local GPU registrations"),
    ("timeouts, seconds", "--engine-timeout", "engine_timeout_s", "S", "for the transfer engine's start"),
    ("timeouts, seconds", "--grace", "grace_s", "S", "for a clean stop after SIGTERM/SIGINT/SIGHUP"),
    (RARE, "--transfer-manager", "transfer_manager", "MODULE:CLASS", "the remote transfer manager"),
    (RARE, "--reap-grace", "reap_grace_s", "S", "of grace_s, what workers get to unpin before SIGTERM"),
    (RARE, "--probe-interval", "probe_interval_s", "S", "from the config on: between heartbeats to the master"),
    (RARE, "--master-lost", "master_lost_s", "S", "from the config on: exit 13 when heartbeats fail this long"),
    (RARE, "--failed-visible", "failed_visible_s", "S", "after a failure, how long `failed` is served (0 to 60)"),
)
SWITCHES = ("allow_loopback_master", "keep_cuda_visible_devices")


class _Parser(argparse.ArgumentParser):
    """Command-line errors end like every other exit: one ``ERROR start_remote:`` line, status 2."""

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
            words = []
            for word in message[len(prefix) :].split():
                flag = word.split("=", 1)[0]
                hint = _hint(flag, known) if flag.startswith("--") else ""
                words.append(f"{word}{hint}")
            message = f"unknown argument(s): {', '.join(words)}"
        logger.error("invalid command line: %s; see %s --help", message, self.prog)
        raise SystemExit(ExitCode.SETTINGS)


def _hint(flag: str, known: list[str]) -> str:
    """The shared did-you-mean; else the flags ``flag`` abbreviates (abbreviations are off, so say so)."""
    if hint := did_you_mean(flag, known, prefix="--"):
        return hint
    longer = sorted(k for k in known if k.startswith(flag) and len(flag) > 3)
    return f" (did you mean {' or '.join(longer[:3])}? flags are not abbreviated)" if longer else ""


def _default(dest: str) -> str:
    if dest in ("master_host", "node_rank", "nnodes"):
        return ""
    if dest == "lock_dir":
        return " (default: $XDG_RUNTIME_DIR when private, else /tmp/flexkv-adapter-<uid>)"
    field = AdapterSettings.model_fields[dest]
    if dest == "master_ports":
        return f" (default: {','.join(map(str, field.default))})"
    return "" if field.default is None else f" (default: {field.default})"


def _text_of(dest: str) -> Callable[[str], object]:
    """How a flag's text becomes a value: one rule with the environment (``1_6``, ``16.0`` for an
    integer, other scripts' digits stay text, which the settings refuse with their own message)."""
    kind = number_kind(AdapterSettings.model_fields[dest])

    def read(text: str) -> object:
        return number_text(text, kind)

    return read


def _exit_lines() -> str:
    """Each exit status with its meaning up to the first detail (the full table is in the docs)."""
    rows = []
    for code, (meaning, _) in MEANINGS.items():
        short = re.sub(r" \([^)]*\)", "", meaning.replace("`", "")).split(": ")[0].split("; ")[0].split(", or ")[0]
        rows.append(f"{int(code)} {short}")
    return _wrapped(rows, "; ")


def _wrapped(items: list[str], sep: str) -> str:
    return textwrap.fill(sep.join(items), 98, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)


def build_parser(prog: str = "start_remote.py") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        usage=f"{prog} --master-host HOST --nnodes N --node-rank RANK [options]",
        description="Supervised FlexKV remote transfer process for nodes 1..N-1 of a multi-node deployment.\n"
        "Flags win over FLEXKV_ADAPTER_* variables, FlexKV's own ones, the --config file and the defaults.",
        epilog=f"{RARE}:\n{_wrapped([*(f for g, f, *_ in FLAGS if g == RARE), '--keep-cuda-visible-devices'], ', ')}"
        f"\n\nexit statuses (full table: docs/start_remote.md#exit-statuses):\n{_exit_lines()}",
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=26, width=100),
        add_help=False,
        allow_abbrev=False,  # a shortened flag would silently change meaning when a flag is added
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for group, flag, dest, metavar, text in FLAGS:
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        shown = argparse.SUPPRESS if group == RARE else f"{text}{_default(dest)}"
        groups[group].add_argument(flag, dest=dest, metavar=metavar, type=_text_of(dest), help=shown)
    deployment = groups["deployment"]
    deployment.add_argument("--config", metavar="FILE", help="YAML settings file (default: $FLEXKV_ADAPTER_CONFIG)")
    deployment.add_argument(
        "--allow-loopback-master",
        dest="allow_loopback_master",
        action="store_const",
        const=True,
        help="accept a loopback master with nnodes > 1 (single-machine testing)",
    )
    groups[RARE].add_argument(
        "--keep-cuda-visible-devices",
        dest="keep_cuda_visible_devices",
        action="store_const",
        const=True,
        help=argparse.SUPPRESS,
    )
    general = parser.add_argument_group("general")
    general.add_argument("-h", "--help", action="help", help="show this help and exit")
    general.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: print the plan (JSON), exit with a real start's status",
    )
    general.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings the command line gives (None: not given, so other sources apply)."""
    return {dest: getattr(args, dest) for dest in (*(f[2] for f in FLAGS), *SWITCHES)}
