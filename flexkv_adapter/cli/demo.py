"""``flexkv-adapter demo``: adapt one small CPU pool of every supported kind, and say why for each refusal.

Refusals and opt-in warnings are expected outcomes here, so they are shown as numbered footnotes
under the table (full text, ``Fix:`` lines included) instead of as log lines that look like failures.
Each view adapt() gives is also handed to ``plan()``: the ``flexkv`` column says whether FlexKV can
register it (``yes``, or ``no`` with the reason in a few words and in full in the row's note).
"""

from __future__ import annotations

import logging
import os
import re
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import AdapterError

if TYPE_CHECKING:
    from ..model.views import PoolView
    from .samples import Sample

COLUMNS = ("source", "view", "flexkv", "layers", "rows", "bytes")
LEGEND = (
    "view: what FlexKV gets and the recognizer that read the KV; flexkv: whether FlexKV can register the view "
    "(plan()'s verdict); layers: offloaded (+N: layers with parts not offloaded); rows: pool rows -> block-aligned "
    "rows; bytes: aliased/copied"
)
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


def _flexkv(view: PoolView, sample: Sample) -> dict[str, Any]:
    """plan()'s verdict on ``view``: whether FlexKV can register it, and if not, why (in a few words and in full)."""
    from ..flexkv.plan import plan

    verdict: dict[str, Any] = {"registers": True, "expected_registers": not sample.plan_refusal}
    try:
        plan(view)
    except AdapterError as exc:
        short = sample.plan_short if sample.plan_refusal and sample.plan_short else type(exc).__name__
        verdict.update(registers=False, short=short, error=type(exc).__name__, reason=str(exc))
    return verdict


def demo_rows(quiet: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """One row per sample: outcome, the full error or report, plan()'s verdict on the view (``flexkv``;
    None where adapt() refused), and the warnings it logged."""
    from ..pipeline.adapting import adapt

    rows: list[dict[str, Any]] = []
    ok = True
    for sample in _samples():
        row: dict[str, Any] = {"source": sample.name, "expected": sample.refused_with or "adapted", "flexkv": None}
        with _captured(quiet) as capture:
            try:
                view = adapt(sample.build(), **sample.options)
            except AdapterError as exc:
                row.update(outcome=type(exc).__name__, error=str(exc))
            else:
                row.update(outcome="adapted", report=view.report.to_dict(), flexkv=_flexkv(view, sample))
        row["warnings"] = capture.messages
        verdict = row["flexkv"]
        row["ok"] = row["outcome"] == row["expected"] and (
            verdict is None or verdict["registers"] == verdict["expected_registers"]
        )
        ok &= row["ok"]
        rows.append(row)
    return rows, ok


def failure(row: dict[str, Any]) -> str:
    """Why a row is not what its sample expects, in one line."""
    if row["outcome"] != row["expected"]:
        return f"{row['source']}: expected {row['expected']}, got {row['outcome']}"
    verdict = row["flexkv"]
    if verdict["registers"]:
        return f"{row['source']}: expected plan() to refuse the view, it planned it"
    return f"{row['source']}: expected plan() to plan the view, got {verdict['error']}"


def _note(row: dict[str, Any]) -> str | None:
    """The footnote text of a row, or None when there is nothing to explain."""
    tag = "expected" if row["outcome"] == row["expected"] else "UNEXPECTED"
    if "error" in row:
        return f"{tag} refusal, {row['outcome']}: {row['error']}"
    notes = []
    if row["warnings"]:
        opted = " (the sample opts in with hybrid='attention_only')" if "attention_only" in row["source"] else ""
        notes.append(f"{tag} warning{opted}: " + "\n".join(w["message"] for w in row["warnings"]))
    verdict = row["flexkv"]
    tag = "expected" if verdict["registers"] == verdict["expected_registers"] else "UNEXPECTED"
    if not verdict["registers"]:
        reason = re.sub(r"^<[^<>]*>: ", "", verdict["reason"])  # the view's repr: the row names the source
        notes.append(f"{tag} plan() refusal (FlexKV cannot register this view), {verdict['error']}: {reason}")
    elif not verdict["expected_registers"]:
        notes.append(f"{tag}: plan() planned this view; the sample expects a refusal")
    return "\n".join(notes) or None


def _cells(row: dict[str, Any], mark: str) -> tuple[str, ...]:
    r = row.get("report")
    if not r:
        return (row["source"], f"refused{mark}", "-", "-", "-", "-")
    verdict = row["flexkv"]
    excluded = len({lid for lid, _ in r["excluded_layers"]})
    # a hybrid's recognizer is "detector/kv-recognizer": the detector is named in the row's note
    return (
        row["source"],
        f"{r['kind'].upper()} {r['recognizer'].rsplit('/', 1)[-1]}{mark}",
        "yes" if verdict["registers"] else f"no: {verdict['short']}",
        f"{len(r['layer_ids'])}{f' (+{excluded})' if excluded else ''}",
        f"{r['rows']} -> {r['aligned_rows']}",
        f"{r['bytes_aliased']}/{r['bytes_copied']}",
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
    """The table, with ``[n]`` marks in the view column and the notes they point to below it (rows with the
    same note share its number)."""
    cells, notes, numbers = [], [], {}
    for row in rows:
        note = _note(row)
        if note and note not in numbers:
            notes.append(note)
            numbers[note] = len(notes)
        cells.append(_cells(row, f" [{numbers[note]}]" if note else ""))
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]

    def line(c: Sequence[str]) -> str:
        return "  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip()

    lines = [line(COLUMNS), line(tuple("-" * w for w in widths)), *map(line, cells), *textwrap.wrap(LEGEND, _WIDTH)]
    if notes:
        lines += ["", "Notes (refusals and warnings the demo expects; `demo --json` has them in full):"]
        for number, note in enumerate(once(notes), 1):
            lines += _wrap(number, note)
    return "\n".join(lines)
