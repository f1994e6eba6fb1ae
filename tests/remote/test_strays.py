"""A machine running other remotes does not change a start_remote test's result (real subprocesses).

The scenario of test_start_remote's ready and master-lost tests runs alone, then beside a stray
start_remote serving another master (its own ports and lock directory) and a stray FlexKV-like spawn
connected to another master: the outcome is the same, and the stray spawn is seen and named as
another master's. Negative control: a spawn connected to this scenario's master is refused (exit 6).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

from flexkv_adapter.remote.exit_codes import ExitCode

from .harness import Remote, holding
from .standin import MasterStandIn, register_gpus
from .test_spawns import Spawned


def _to_ready(remote: Remote) -> MasterStandIn:
    master = MasterStandIn("127.0.0.1", remote.ports, remote.register_port, 1)
    remote.wait_state("waiting_for_gpus")
    register_gpus(remote.register_port, 1)
    remote.wait_state("ready")
    return master


def _scenario(tmp: Path) -> dict[str, object]:
    """Ready, one transfer, then the master goes away: exit 13 with nothing left behind."""
    tmp.mkdir()
    remote = Remote(tmp)
    master = _to_ready(remote)
    try:
        done = master.submit(7)
    finally:
        master.close()
    code, _, err = remote.finish()
    return {
        "code": code,
        "states": remote.states(err),
        "submit": done,
        "orphans": remote.orphans(),
        "locks": sorted(p.name for p in (tmp / "locks").iterdir()),
        "refused": "already spawned a remote" in err or "already serves this master" in err,
        "err": err,
    }


@contextlib.contextmanager
def _strays(tmp: Path) -> Iterator[tuple[Remote, Spawned]]:
    """A start_remote ready for a master of its own, and a FlexKV-like spawn connected to another."""
    tmp.mkdir()
    stray = Remote(tmp)
    master = _to_ready(stray)
    try:
        with holding() as a, holding() as b, holding() as c:
            spawn = Spawned(a, b, c)
            try:
                yield stray, spawn
            finally:
                spawn.close()
        assert stray.proc.poll() is None, stray.finish()  # the stray was never disturbed either
    finally:
        code, err, _ = stray.stop(signal.SIGTERM)
        master.close()
    assert code == ExitCode.OK, err


def test_strays_for_other_masters_do_not_change_the_result(tmp_path):
    alone = _scenario(tmp_path / "alone")
    with _strays(tmp_path / "strays") as (_, spawn):
        beside = _scenario(tmp_path / "beside")
    assert alone["code"] == ExitCode.MASTER_LOST and not alone["refused"], alone["err"]
    for key in ("code", "states", "submit", "orphans", "locks", "refused"):
        assert beside[key] == alone[key], (key, beside["err"])
    err = str(beside["err"])  # the stray spawn was looked at, and told to be another master's
    assert f"spawned a remote for another master on this node: pid {spawn.pid}: " in err, err
    assert "not to this master" in err


def test_a_spawn_for_this_master_beside_the_strays_is_still_refused(tmp_path):
    with _strays(tmp_path / "strays"), holding() as a, holding() as b, holding() as c:
        mine = Spawned(a, b, c)
        try:
            (tmp_path / "mine").mkdir()
            remote = Remote(tmp_path / "mine", ports=(a, b, c))
            code, _, err = remote.finish()
        finally:
            mine.close()
    last = err.strip().splitlines()[-1]
    assert code == ExitCode.ALREADY_RUNNING, err
    assert f"pid {mine.pid}: " in last and "connected to this master's 127.0.0.1:" in last, last
    assert "FlexKV's create_process script" in last
