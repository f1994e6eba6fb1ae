"""Command line: ``flexkv-adapter demo`` (the main job), ``inspect``, ``doctor``, ``start-remote``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .errors import AdapterError, SettingsError


def _samples() -> Any:
    from .samples import SAMPLES

    return SAMPLES


_COLUMNS = ("source", "recognizer", "view", "layers", "excluded", "rows", "bytes aliased", "bytes copied")


def _demo_rows() -> tuple[list[dict[str, Any]], bool]:
    from .adapting import adapt

    rows: list[dict[str, Any]] = []
    ok = True
    for sample in _samples():
        row: dict[str, Any] = {"source": sample.name, "expected": sample.refused_with or "adapted"}
        try:
            report = adapt(sample.build(), **sample.options).report
        except AdapterError as exc:
            row.update(outcome=type(exc).__name__, error=str(exc).splitlines()[0])
        else:
            row.update(outcome="adapted", report=report.to_dict())
        row["ok"] = row["outcome"] == row["expected"]
        ok &= row["ok"]
        rows.append(row)
    return rows, ok


def _table(rows: list[dict[str, Any]]) -> str:
    cells = []
    for row in rows:
        r = row.get("report")
        if r:
            cells.append(
                (
                    row["source"],
                    r["recognizer"],
                    r["kind"].upper(),
                    str(len(r["layer_ids"])),
                    str(len({lid for lid, _ in r["excluded_layers"]})),
                    f"{r['rows']} -> {r['aligned_rows']}",
                    str(r["bytes_aliased"]),
                    str(r["bytes_copied"]),
                )
            )
        else:
            cells.append((row["source"], "-", f"refused: {row['outcome']}", "-", "-", "-", "-", "-"))
    widths = [max(len(c[i]) for c in [_COLUMNS, *cells]) for i in range(len(_COLUMNS))]

    def line(c: Sequence[str]) -> str:
        return "  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip()

    return "\n".join([line(_COLUMNS), line(tuple("-" * w for w in widths)), *map(line, cells)])


def _cmd_demo(args: argparse.Namespace) -> int:
    rows, ok = _demo_rows()
    if args.json:
        print(json.dumps({"ok": ok, "pools": rows}, indent=2))
    else:
        print(_table(rows))
    if not ok:
        bad = next(r for r in rows if not r["ok"])
        print(f"error: {bad['source']}: expected {bad['expected']}, got {bad['outcome']}", file=sys.stderr)
        return 1
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import format_doctor, run_doctor

    result = run_doctor(args.config, require_flexkv=args.require_flexkv)
    print(json.dumps(result, indent=2, default=str) if args.json else format_doctor(result))
    return 0 if result["ok"] else 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .spec import load_spec

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexkv-adapter", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="adapt one small CPU pool of every supported kind and print a table")
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.set_defaults(func=_cmd_demo)
    doctor = sub.add_parser("doctor", help="preflight: environment, FlexKV, resolved settings and their sources")
    doctor.add_argument("--config", help="YAML settings file (default: $FLEXKV_ADAPTER_CONFIG)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--require-flexkv", action="store_true", help="treat a missing FlexKV as an error")
    doctor.set_defaults(func=_cmd_doctor)
    inspect = sub.add_parser("inspect", help="validate layout spec YAML files and explain what they mean")
    inspect.add_argument("specs", nargs="+", help="spec files (see configs/layouts/)")
    inspect.add_argument("--json", action="store_true", help="one JSON object per spec")
    inspect.set_defaults(func=_cmd_inspect)
    sub.add_parser(
        "start-remote", help="supervised FlexKV remote transfer process (see start-remote --help)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["start-remote"]:  # its own parser, logging and exit handling
        from .remote.cli import entry_point

        entry_point(argv[1:], prog="flexkv-adapter start-remote")
    args = build_parser().parse_args(argv)
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
