"""scripts/bench_serving_sglang.py's pairing: within a step, each mode leads on as many hits as the other.

FlexKV's load waits on its transfer process (polled every 1 ms, counted in the scheduler's CPU time), and that
wait depends on what the other rig's transfer process is copying: the mode that leads on a hit pays differently
from the one that follows. No timing is asserted here; what is checked is the order the step runs requests in.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "scripts"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(
        "bench_serving_sglang_under_test", SCRIPTS / "bench_serving_sglang.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "_trim_calls", lambda: None)
    monkeypatch.setattr(module, "_bridge_poll", lambda r, direct: 0.0)
    return module


def _rig():
    bridge = types.SimpleNamespace(connector=types.SimpleNamespace(kv_manager=None), manager="m", observed="o")
    return types.SimpleNamespace(cache=types.SimpleNamespace(flexkv_connector=bridge))


def _leads(bench, monkeypatch, n: int, step: int) -> dict[str, dict[bool, int]]:
    """Per mode: on how many hits (True) and misses (False) of the step it ran first in its request pair."""
    ran: list[tuple[str, bool]] = []
    rigs = {m: _rig() for m in bench.MODES}
    mode_of = {id(r): m for m, r in rigs.items()}
    monkeypatch.setattr(
        bench, "_bridge_request", lambda r, ids, rid, direct: ran.append((mode_of[id(r)], ids[0] == ids[1])) or 0.0
    )
    work = {m: bench.Workload(m, base=10**8 * (i + 1)) for i, m in enumerate(bench.MODES)}
    bench.paired_step("bridge", rigs, work, n, control=False, first=step)
    leads = {m: {True: 0, False: 0} for m in bench.MODES}
    for (mode, hit), (_, other_hit) in zip(ran[0::2], ran[1::2], strict=True):
        assert hit == other_hit, "a pair runs the same kind of request in each mode"
        leads[mode][hit] += 1
    return leads


@pytest.mark.parametrize("n", [8, 64, 256])
@pytest.mark.parametrize("step", [0, 1])
def test_each_mode_leads_on_half_the_hits_and_half_the_misses(bench, monkeypatch, n, step):
    leads = _leads(bench, monkeypatch, n, step)
    assert leads["baseline"] == leads["plugin"] == {True: n // 4, False: n // 4}


def test_negative_control_swapping_the_lead_every_request_puts_one_mode_ahead_on_every_hit(bench, monkeypatch):
    source = (SCRIPTS / "bench_serving_sglang.py").read_text()
    swapped = source.replace("order if (i // 2) % 2 else order[::-1]", "order if i % 2 else order[::-1]")
    assert swapped != source
    exec(compile(swapped, str(SCRIPTS / "bench_serving_sglang.py"), "exec"), vars(bench))
    monkeypatch.setattr(bench, "_trim_calls", lambda: None)
    monkeypatch.setattr(bench, "_bridge_poll", lambda r, direct: 0.0)
    leads = _leads(bench, monkeypatch, 64, 0)
    assert sorted(leads[m][True] for m in bench.MODES) == [0, 32]
