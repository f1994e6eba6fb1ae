"""run_engine: a result, a deadline, a death, and a grandchild that keeps the output open."""

from __future__ import annotations

import sys
import time

import pytest

from tests.e2e.engine_process import EngineRunError, run_engine

PY = sys.executable


def test_the_result_line_is_returned_with_the_log():
    out = run_engine([PY, "-c", "print('hi'); print('RESULT {\"a\": 1}')"], deadline_s=30)
    assert out["a"] == 1 and "hi" in out["log"]


def test_a_hang_fails_at_the_deadline_with_the_last_lines():
    t0 = time.monotonic()
    with pytest.raises(EngineRunError, match="did not finish within 2 s") as err:
        run_engine([PY, "-c", "print('started', flush=True); import time; time.sleep(60)"], deadline_s=2)
    assert "started" in str(err.value) and time.monotonic() - t0 < 10


def test_an_exit_without_a_result_fails():
    with pytest.raises(EngineRunError, match="exited 3 with 0 results"):
        run_engine([PY, "-c", "import sys; print('boom'); sys.exit(3)"], deadline_s=30)


def test_a_grandchild_holding_the_output_open_does_not_delay_the_result():
    code = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        "print('RESULT {\"done\": true}', flush=True)"
    )
    t0 = time.monotonic()
    assert run_engine([PY, "-c", code], deadline_s=30)["done"] is True
    assert time.monotonic() - t0 < 20  # a pipe would have waited for the grandchild's 60 s
