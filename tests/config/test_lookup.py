"""The engine's bounded name lookups (flexkv_adapter/config/lookup.py).

A resolver that never answers costs one thread per distinct name. Names the engine looks up come
partly from start_remote's answers (the master it reports), so their number is not the engine's to
bound: the threads in flight are capped, and a lookup past the cap times out at once. A thread that
cannot start (the process is out of threads) used to leave its name pending forever, so every later
lookup of that name timed out even once threads were free again, and the caller met a raw RuntimeError.
"""

from __future__ import annotations

import itertools
import socket
import threading

import pytest

from flexkv_adapter.config import lookup

_names = itertools.count()


@pytest.fixture
def dead_resolver(monkeypatch):
    """``socket.getaddrinfo`` that blocks every name lookup until the test ends (numeric ones answer)."""
    real, release = socket.getaddrinfo, threading.Event()

    def blocking(host, *args, **kwargs):
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, *args, **kwargs)
        release.wait()
        raise socket.gaierror(socket.EAI_AGAIN, "released")

    monkeypatch.setattr(socket, "getaddrinfo", blocking)
    yield
    release.set()
    for thread in threading.enumerate():  # the pending lookups end now: none is left for the next test
        if thread.name.endswith(".hangs.test"):
            thread.join(5.0)


@pytest.mark.parametrize("extra", [1, 40])
def test_distinct_hanging_names_hold_at_most_the_cap_of_threads(dead_resolver, extra):
    count = lookup.MAX_IN_FLIGHT + extra
    run = next(_names)
    for i in range(count):
        with pytest.raises(lookup.LookupTimedOut):
            lookup.getaddrinfo(f"n{i}-{run}.hangs.test", 80, 0.0)
    mine = [t for t in threading.enumerate() if t.name.endswith(f"-{run}.hangs.test")]
    assert len(mine) <= lookup.MAX_IN_FLIGHT


def test_a_thread_that_cannot_start_times_out_and_leaves_nothing_pending(monkeypatch):
    name = f"nothread-{next(_names)}.test"
    real_start = threading.Thread.start

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(lookup.LookupTimedOut, match="thread"):
        lookup.getaddrinfo(name, 80, 0.1)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: [(socket.AF_INET, 1, 6, "", ("10.0.0.9", 80))])
    assert lookup.getaddrinfo(name, 80, 5.0)[0][4] == ("10.0.0.9", 80)  # the name is not left pending


def test_control_ip_literals_never_take_a_thread(dead_resolver):
    before = threading.active_count()
    for i in range(3 * lookup.MAX_IN_FLIGHT):
        assert lookup.getaddrinfo(f"10.0.{i}.1", 80, 0.0)[0][4] == (f"10.0.{i}.1", 80)
    assert threading.active_count() == before
