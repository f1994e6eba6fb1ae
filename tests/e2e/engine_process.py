"""Run an engine in its own process group under a deadline: a hang is a failure, never a stuck CI.

The engine's interpreter is another environment's (``.venv-vllm``, ``.venv-sglang``), so the
engine runs as a child command; its result is the last stdout line that starts with ``RESULT ``
(JSON). On a deadline or a non-zero exit the whole group is killed and the error carries the
engine's last log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

TAIL_LINES = 60


class EngineRunError(AssertionError):
    """The engine hung, died or printed no result; the message holds its last log lines."""


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def run_engine(argv: Sequence[str], *, deadline_s: float, env: Mapping[str, str] | None = None,
               cwd: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``argv`` (a new session, so its own process group) and return its ``RESULT`` JSON."""
    child_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env, cwd=cwd,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        late = f"{argv[1:3]} did not finish within {deadline_s:.0f} s"
        raise EngineRunError(f"{late}; last lines:\n{_tail(out)}") from None
    finally:
        _kill_group(proc)  # whatever it left behind (engine workers, FlexKV's processes)
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise EngineRunError(
            f"{argv[1:3]} exited {proc.returncode} with {len(results)} results; last lines:\n{_tail(out)}"
        )
    result: dict[str, Any] = json.loads(results[-1])
    result["log"] = _tail(out)
    return result


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def emit(result: Mapping[str, Any]) -> None:
    """The engine side: print the one line ``run_engine`` reads."""
    print("RESULT " + json.dumps(dict(result)), flush=True)
