"""``flexkv-adapter demo``: adapt one small CPU pool of every supported kind, and say why for each refusal.

Refusals and opt-in warnings are expected outcomes here, so they are shown as numbered footnotes
under the table (full text, ``Fix:`` lines included) instead of as log lines that look like failures.
"""

from __future__ import annotations

import logging
import os
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import AdapterError

COLUMNS = ("source", "view", "layers", "excl", "rows", "aliased", "copied")
LEGEND = "view: what FlexKV gets and the recognizer that read the KV; excl: layers not offloaded; aliased/copied: bytes"
_WIDTH = 100
_LONG = 50  # a parenthesised explanation this long is printed once; later notes point to it


def _samples() -> Any:
    from .samples import SAMPLES

    return SAMPLES


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append({"level": record.levelname, "logger": record.name, "message": record.getMessage()})


@contextmanager
def _captured(quiet: bool) -> Iterator[_Capture]:
    """Collect the library's warnings; with ``quiet``, keep them off stderr (they become footnotes)."""
    logger = logging.getLogger("flexkv_adapter")
    capture, propagate = _Capture(), logger.propagate
    logger.addHandler(capture)
    logger.propagate = propagate and not quiet
    try:
        yield capture
    finally:
        logger.removeHandler(capture)
        logger.propagate = propagate


@contextmanager
def library_defaults() -> Iterator[list[str]]:
    """Set the user's ``FLEXKV_ADAPTER_*`` variables (config file included) aside while the demo runs.

    The demo shows what the library does with its own samples; a ``hybrid`` opt-in or a broken
    config file of the user's would change the rows it expects. Yields the names it ignored.
    """
    from ..config.settings import ENV_PREFIX

    saved = {k: v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
    for name in saved:
        del os.environ[name]
    try:
        yield sorted(saved)
    finally:
        os.environ.update(saved)


def ignored_line(ignored: Sequence[str]) -> str:
    """What the demo says about the settings it set aside (empty when there were none)."""
    if not ignored:
        return ""
    return f"The demo ran with the library's defaults; it ignored {', '.join(ignored)} from the environment."


def demo_rows(quiet: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """One row per sample: outcome, the full error or report, and the warnings it logged."""
    from ..pipeline.adapting import adapt

    rows: list[dict[str, Any]] = []
    ok = True
    for sample in _samples():
        row: dict[str, Any] = {"source": sample.name, "expected": sample.refused_with or "adapted"}
        with _captured(quiet) as capture:
            try:
                report = adapt(sample.build(), **sample.options).report
            except AdapterError as exc:
                row.update(outcome=type(exc).__name__, error=str(exc))
            else:
                row.update(outcome="adapted", report=report.to_dict())
        row["warnings"] = capture.messages
        row["ok"] = row["outcome"] == row["expected"]
        ok &= row["ok"]
        rows.append(row)
    return rows, ok


def _note(row: dict[str, Any]) -> str | None:
    """The footnote text of a row, or None when there is nothing to explain."""
    tag = "expected" if row["ok"] else "UNEXPECTED"
    if "error" in row:
        return f"{tag} refusal, {row['outcome']}: {row['error']}"
    if row["warnings"]:
        opted = " (the sample opts in with hybrid='attention_only')" if "attention_only" in row["source"] else ""
        return f"{tag} warning{opted}: " + "\n".join(w["message"] for w in row["warnings"])
    return None


def _cells(row: dict[str, Any], mark: str) -> tuple[str, ...]:
    r = row.get("report")
    if not r:
        return (row["source"], f"refused{mark}", "-", "-", "-", "-", "-")
    # a hybrid's recognizer is "detector/kv-recognizer": the detector is named in the row's note
    return (
        row["source"],
        f"{r['kind'].upper()} {r['recognizer'].rsplit('/', 1)[-1]}{mark}",
        str(len(r["layer_ids"])),
        str(len({lid for lid, _ in r["excluded_layers"]})),
        f"{r['rows']} -> {r['aligned_rows']}",
        str(r["bytes_aliased"]),
        str(r["bytes_copied"]),
    )


def _parentheses(text: str) -> list[str]:
    """The outermost ``(...)`` segments of ``text``, brackets included."""
    found, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            start = i if depth == 0 else start
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                found.append(text[start : i + 1])
    return found


def once(notes: list[str]) -> list[str]:
    """Each long parenthesised explanation in full the first time; later, a pointer to that note."""
    first: dict[str, int] = {}
    out = []
    for number, note in enumerate(notes, 1):
        for segment in dict.fromkeys(_parentheses(note)):
            if len(segment) < _LONG:
                continue
            if segment not in first:
                first[segment] = number
                head, _, tail = note.partition(segment)
                note = head + segment + tail.replace(segment, "(as above)")
            else:
                note = note.replace(segment, f"(as in [{first[segment]}])")
        out.append(note)
    return out


def _wrap(number: int, text: str) -> list[str]:
    head, indent = f"[{number}] ", " " * (len(str(number)) + 3)
    out: list[str] = []
    for i, para in enumerate(text.splitlines()):
        first = head if i == 0 else indent
        wrapped = textwrap.wrap(para, _WIDTH, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False)
        out += wrapped or [first]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The table, with ``[n]`` marks in the view column and the notes they point to below it."""
    cells, notes = [], []
    for row in rows:
        note = _note(row)
        if note:
            notes.append(note)
        cells.append(_cells(row, f" [{len(notes)}]" if note else ""))
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]

    def line(c: Sequence[str]) -> str:
        return "  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip()

    lines = [line(COLUMNS), line(tuple("-" * w for w in widths)), *map(line, cells), *textwrap.wrap(LEGEND, _WIDTH)]
    if notes:
        lines += ["", "Notes (refusals and warnings the demo expects; `demo --json` has them in full):"]
        for number, note in enumerate(once(notes), 1):
            lines += _wrap(number, note)
    return "\n".join(lines)
