"""start_remote's start-up lookups of the master's name (the preflight, the lock key, the spawn check)
share one connect_timeout_s, and health_host has a bound of its own: a resolver that answers each just
inside the bound ends start-up with exit 10 after connect_timeout_s in all, not one bound per lookup.
The slow resolver is a ``socket.getaddrinfo`` that answers a name after a fixed delay (in the real
start_remote process, by a sitecustomize)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from flexkv_adapter.config import lookup
from flexkv_adapter.remote.lookup_budget import LookupBudget

from .harness import ROOT, Remote

SLOW = "master.slow-resolver.test"
SITECUSTOMIZE = """
import os, socket, time

_real_getaddrinfo, _real_gethostbyname = socket.getaddrinfo, socket.gethostbyname
_delay = float(os.environ["SLOW_S"])


def _ask():
    with open(os.environ["SLOW_MARK"], "a") as mark:
        mark.write(f"{time.monotonic()}\\n")  # CLOCK_MONOTONIC: one clock for every process
    time.sleep(_delay)


def getaddrinfo(host, port, *args, **kwargs):
    if host == os.environ["SLOW_NAME"] and not kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
        _ask()
        return _real_getaddrinfo("127.0.0.1", port, *args, **kwargs)
    return _real_getaddrinfo(host, port, *args, **kwargs)


def gethostbyname(host):
    if host == os.environ["SLOW_NAME"]:
        _ask()
        return "127.0.0.1"
    return _real_gethostbyname(host)


socket.getaddrinfo, socket.gethostbyname = getaddrinfo, gethostbyname
"""


def test_each_step_gets_what_the_earlier_ones_left(monkeypatch):
    real = socket.getaddrinfo

    def slow(host, port, *args, **kwargs):
        if host == SLOW and not kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            time.sleep(0.4)
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    budget = LookupBudget(1.0)
    for _ in range(2):
        budget.spend(lambda left: lookup.getaddrinfo(SLOW, None, left))
    assert 0.0 < budget.left_s() <= 0.2 + 0.05
    with pytest.raises(lookup.LookupTimedOut):  # 0.2 s left for a 0.4 s answer
        budget.spend(lambda left: lookup.getaddrinfo(SLOW, None, left))
    assert budget.left_s() == 0.0
    roomy = LookupBudget(2.0)  # negative control: three answers fit in it
    for _ in range(3):
        roomy.spend(lambda left: lookup.getaddrinfo(SLOW, None, left))


def _start(tmp: Path, slow_s: float, connect_s: float, **flags: object) -> tuple[Remote, Path]:
    """start_remote whose resolver answers the master's name after ``slow_s``."""
    tmp.mkdir()
    (tmp / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mark = tmp / "lookups"
    env = {"PYTHONPATH": f"{tmp}:{ROOT}", "SLOW_NAME": SLOW, "SLOW_S": str(slow_s), "SLOW_MARK": str(mark)}
    return Remote(tmp, env=env, master_host=SLOW, connect_timeout=connect_s, **flags), mark


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Both start_remotes at once (one start-up's time): exit status, stderr, when each lookup began and
    when the process ended (one monotonic clock)."""
    base = tmp_path_factory.mktemp("budget")
    started = {
        "slow": _start(base / "slow", 1.5, 2.0),
        "fits": _start(base / "fits", 0.2, 3.0),
        "health": _start(base / "health", 0.6, 2.0, health_host=SLOW),  # 3 master lookups: 1.8 of 2 s
    }
    seen = {}
    for name, (remote, mark) in started.items():
        try:
            code, _, err = remote.finish(timeout=60)
        finally:
            remote.proc.kill()
        ended = time.monotonic()  # the slow one ends first: its end is seen on time
        seen[name] = code, err, [float(x) for x in mark.read_text().split()] if mark.exists() else [], ended
    return seen


def test_a_resolver_slow_on_every_lookup_ends_start_up_with_exit_10_by_connect_timeout(outcomes):
    connect_s, slow_s = 2.0, 1.5  # each lookup fits the bound alone; two do not fit it together
    code, err, asked, ended = outcomes["slow"]
    assert code == 10, err[-2000:]
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert errors and all("did not resolve within connect_timeout_s=2 s" in line for line in errors), errors
    assert len(asked) == 2, asked  # the preflight's answered, the lock key's got what was left
    # the lock key's lookup had 0.5 s (each on its own: 1.5 s, then the spawn check's 1.5 s and the polls')
    assert ended - asked[1] <= connect_s - slow_s + 1.0, ended - asked[1]


def test_a_resolver_whose_answers_fit_connect_timeout_together_passes_start_up(outcomes):
    """Negative control: the budget charges only the lookups; start-up goes on to the master's ports."""
    code, err, asked, _ = outcomes["fits"]
    assert code == 10, err[-2000:]  # no master listens: its ports refuse for connect_timeout_s
    assert "not reachable within 3s" in err and "did not resolve" not in err, err[-2000:]
    assert len(asked) >= 4, asked  # the preflight, the lock key, the spawn check, the port polls


def test_health_host_is_looked_up_with_its_own_bound(outcomes):
    """The master's three lookups leave 0.2 s of connect_timeout_s; health_host (the same slow name)
    still resolves in its own 2 s and binds, so start-up reaches the port poll instead of exit 9."""
    code, err, asked, _ = outcomes["health"]
    assert code == 10, err[-2000:]
    assert "not reachable within 2s" in err and "did not resolve" not in err, err[-2000:]
    assert len(asked) >= 4, asked  # the three master lookups and health_host's
