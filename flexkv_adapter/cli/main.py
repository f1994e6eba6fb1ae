"""Command line: ``flexkv-adapter demo`` (the main job), ``inspect``, ``doctor``, ``start-remote``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import AdapterError, SettingsError
from .parsing import Parser

DESCRIPTION = """\
Zero-copy, block-aligned FlexKV views of KV-cache pools.

Start with `flexkv-adapter demo`; `flexkv-adapter COMMAND --help` describes each command.
Python API: `from flexkv_adapter import adapt, plan, register`."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import demo_rows, failure, ignored_line, library_defaults, table

    with library_defaults() as ignored:
        rows, ok = demo_rows(quiet=args.verbose == 0)
    if args.json:
        print(json.dumps({"ok": ok, "ignored_settings": ignored, "pools": rows}, indent=2))
    else:
        print(table(rows) + (f"\n\n{ignored_line(ignored)}" if ignored else ""))
    if not ok:
        print(f"error: {failure(next(r for r in rows if not r['ok']))}", file=sys.stderr)
        return 1
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import format_doctor, run_doctor

    result = run_doctor(args.config, require_flexkv=args.require_flexkv)
    print(json.dumps(result, indent=2, default=str) if args.json else format_doctor(result))
    return 0 if result["ok"] else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..readers.spec import load_spec

    failed = False
    for path in args.specs:
        try:
            spec = load_spec(path)
        except AdapterError as exc:  # report it and go on to the next file
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            failed = True
            continue
        ok, verdict = spec.addressability()
        if args.json:
            print(json.dumps({**spec.model_dump(), "addressable": ok, "verdict": verdict}))
        else:
            print(spec.describe())
    return 1 if failed else 0


def build_parser() -> Parser:
    parser = Parser(  # its error() adds a did-you-mean, for the subcommands' parsers too
        prog="flexkv-adapter", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    # -v after the subcommand too: its own dest, summed in main(), so neither place overrides the other
    verbose = Parser(add_help=False)
    verbose.add_argument("-v", "--verbose", dest="sub_verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, what: str) -> Parser:
        # help= is the line in the command list; description= the first line of `COMMAND --help`
        parsed = sub.add_parser(name, parents=[verbose], help=what, description=what[0].upper() + what[1:] + ".")
        parsed.is_command = True
        return parsed

    demo = command("demo", "adapt one small CPU pool of every supported kind and print a table")
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.set_defaults(func=_cmd_demo)
    doctor = command("doctor", "preflight: environment, FlexKV, engines, resolved settings and their sources")
    doctor.add_argument("--config", help="YAML settings file (default: $FLEXKV_ADAPTER_CONFIG)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--require-flexkv", action="store_true", help="treat a missing FlexKV as an error")
    doctor.set_defaults(func=_cmd_doctor)
    inspect = command("inspect", "validate layout spec YAML files and explain what they mean")
    inspect.add_argument("specs", nargs="+", help="spec files (see configs/layouts/)")
    inspect.add_argument("--json", action="store_true", help="one JSON object per spec")
    inspect.set_defaults(func=_cmd_inspect)
    sub.add_parser(
        "start-remote", help="supervised FlexKV remote transfer process (see start-remote --help)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lead = 0  # -v before the command is ours; start-remote takes its own -v
    while lead < len(argv) and (argv[lead] == "--verbose" or (len(argv[lead]) > 1 and argv[lead].rstrip("v") == "-")):
        lead += 1
    if argv[lead : lead + 1] == ["start-remote"]:  # its own parser, logging and exit handling
        from ..remote.cli import entry_point

        entry_point(argv[lead + 1 :] + (["--verbose"] if lead else []), prog="flexkv-adapter start-remote")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `flexkv-adapter`: show what there is
        parser.print_help()
        return 0
    args.verbose += args.sub_verbose
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except AdapterError as exc:  # settings problems are one per line; show them all, briefly
        lines = str(exc).splitlines()
        shown = "; ".join(line.strip() for line in lines) if isinstance(exc, SettingsError) else lines[0]
        print(f"error: {shown}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `inspect --json | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the signal


if __name__ == "__main__":
    sys.exit(main())
