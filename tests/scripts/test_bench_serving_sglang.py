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


def _leads(bench, monkeypatch, n: int, steps: int) -> dict[str, dict[bool, int]]:
    """Per mode: on how many hits (True) and misses (False) it ran first in its request pair, over ``steps`` steps
    run as ``measure`` runs them (the workloads carry on from step to step; ``first`` is the step's index)."""
    ran: list[tuple[str, bool]] = []
    rigs = {m: _rig() for m in bench.MODES}
    mode_of = {id(r): m for m, r in rigs.items()}
    monkeypatch.setattr(
        bench, "_bridge_request", lambda r, ids, rid, direct: ran.append((mode_of[id(r)], ids[0] == ids[1])) or 0.0
    )
    work = {m: bench.Workload(m, base=10**8 * (i + 1)) for i, m in enumerate(bench.MODES)}
    for step in range(steps):
        bench.paired_step("bridge", rigs, work, n, control=False, first=step)
    leads = {m: {True: 0, False: 0} for m in bench.MODES}
    for (mode, hit), (_, other_hit) in zip(ran[0::2], ran[1::2], strict=True):
        assert hit == other_hit, "a pair runs the same kind of request in each mode"
        leads[mode][hit] += 1
    return leads


@pytest.mark.parametrize(("n", "steps"), [(1, 4), (1, 400), (2, 4), (8, 1), (64, 1), (64, 4), (256, 1)])
def test_each_mode_leads_on_half_the_hits_and_half_the_misses(bench, monkeypatch, n, steps):
    leads = _leads(bench, monkeypatch, n, steps)
    assert leads["baseline"] == leads["plugin"] == {True: n * steps // 4, False: n * steps // 4}


def test_a_plan_whose_steps_cannot_balance_the_lead_is_refused(bench):
    with pytest.raises(ValueError, match="multiple of 4"):
        bench.measure([_rig(), _rig()], "bridge", 3, repeats=2, steps=4)
    with pytest.raises(ValueError, match="multiple of 4"):
        bench.measure([_rig(), _rig()], "bridge", 1, repeats=2, steps=6)


@pytest.mark.parametrize(("n", "steps"), [(1, 400), (64, 1)])  # over a run at one request; within a step at 64
def test_negative_control_swapping_the_lead_every_request_and_step_puts_one_mode_ahead_on_every_hit(
    bench, monkeypatch, n, steps
):
    source = (SCRIPTS / "bench_serving_sglang.py").read_text()
    swapped = source.replace("order if (i // 2) % 2 else order[::-1]", "order if i % 2 else order[::-1]")
    swapped = swapped.replace("MODES if (first // 2) % 2 else MODES[::-1]", "MODES if first % 2 else MODES[::-1]")
    assert swapped.count("% 2 else") == source.count("% 2 else") and swapped != source
    exec(compile(swapped, str(SCRIPTS / "bench_serving_sglang.py"), "exec"), vars(bench))
    monkeypatch.setattr(bench, "_trim_calls", lambda: None)
    monkeypatch.setattr(bench, "_bridge_poll", lambda r, direct: 0.0)
    leads = _leads(bench, monkeypatch, n, steps)
    assert sorted(leads[m][True] for m in bench.MODES) == [0, n * steps // 2]
