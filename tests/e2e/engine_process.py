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
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

TAIL_LINES = 60


class EngineRunError(AssertionError):
    """The engine hung, died or printed no result; the message holds its last log lines."""


def _tail(text: str) -> str:
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def run_engine(argv: Sequence[str], *, deadline_s: float, env: Mapping[str, str] | None = None,
               cwd: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``argv`` (a new session, so its own process group) and return its ``RESULT`` JSON.

    The output goes to a file, not a pipe: processes the engine spawns (FlexKV's transfer manager
    and workers) inherit it, and a pipe they hold open would block the read until the deadline
    after the engine itself has exited. The engine is waited on; then its whole group is killed.
    """
    child_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, text=True, env=child_env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
        late = False
        try:
            proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            late = True
        finally:
            _kill_group(proc)  # whatever it left behind (engine workers, FlexKV's processes)
            proc.wait()
        log.seek(0)
        out = log.read()
    if late:
        raise EngineRunError(f"{argv[1:3]} did not finish within {deadline_s:.0f} s; last lines:\n{_tail(out)}")
    results = [line[len("RESULT ") :] for line in out.splitlines() if line.startswith("RESULT ")]
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
