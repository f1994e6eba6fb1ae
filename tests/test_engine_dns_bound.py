"""The engine's name lookups (``health_host``, the master's name) end by its deadline, whatever the
resolver does: a resolver that never answers is a ``socket.getaddrinfo`` blocked on an Event."""

from __future__ import annotations

import socket
import threading

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.integrations import external_remote, lookup
from flexkv_adapter.integrations.external_remote import ExternalRemote, ExternalRemoteError, wait_for_start_remote
from flexkv_adapter.remote.health import HealthServer
from flexkv_adapter.remote.states import State, StateTracker

PORTS = ("5556", "5557", "5558")
HANG = "hangs.in-the-resolver.test"
BOUND_S = 20.0  # generous: without the bound the call never returns at all


@pytest.fixture
def resolver(monkeypatch):
    """``socket.getaddrinfo`` that blocks for HANG until the test ends; lists the names it was asked to
    look up. As the real one, it answers AI_NUMERICHOST calls without the resolver."""
    real, release, calls = socket.getaddrinfo, threading.Event(), []

    def blocking(host, *args, **kwargs):
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, *args, **kwargs)
        calls.append(host)
        if host == HANG:
            release.wait()
            raise socket.gaierror(socket.EAI_NONAME, "released")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", blocking)
    monkeypatch.setattr(external_remote, "_resolved", {}, raising=False)
    yield calls
    release.set()


def _outcome(call):
    """Run ``call`` in a thread; what it returned or raised, or an AssertionError if it outlives BOUND_S."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(BOUND_S)
    assert not worker.is_alive(), f"still blocked after {BOUND_S} s: the lookup has no deadline"
    return result[0]


def _serve(master: str):
    tracker = StateTracker({"master": master, "node_rank": 1})
    tracker.set(State.WAITING_FOR_GPUS)
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    return server


@pytest.fixture
def endpoint():
    server = _serve("10.0.0.1:5556")
    yield server.address[1]
    server.stop()


def test_a_health_host_that_hangs_in_the_resolver_ends_by_remote_wait_s(resolver, endpoint):
    settings = load_settings(health_host=HANG, health_port=endpoint, remote_wait_s=0.5, remote_absent_s=0.5)
    error = _outcome(lambda: wait_for_start_remote(settings, "10.0.0.1", PORTS, poll_s=0.05))
    assert isinstance(error, ExternalRemoteError), error
    assert "start_remote" in str(error) and f"looking up '{HANG}' timed out" in str(error)
    assert resolver.count(HANG) == 1  # one lookup in flight per name, not one per poll


def test_a_master_name_that_hangs_in_the_resolver_ends_by_remote_wait_s(resolver, endpoint):
    settings = load_settings(health_port=endpoint, remote_wait_s=0.5, remote_absent_s=0.5)
    error = _outcome(lambda: wait_for_start_remote(settings, HANG, PORTS, poll_s=0.05))
    assert isinstance(error, ExternalRemoteError), error
    text = str(error)
    assert "start_remote answered" in text and f"its master 10.0.0.1:5556 is the engine's {HANG}:5556" in text
    assert f"looking up '{HANG}' timed out" in text


def test_a_master_name_that_hangs_is_bounded_in_the_ready_file_path_too(resolver, tmp_path):
    ready = tmp_path / "ready.json"
    ready.write_text(f'{{"state": "ready", "master": "10.0.0.1:5556", "pid": {__import__("os").getpid()}}}')
    settings = load_settings(ready_file=ready, remote_wait_s=0.5)
    error = _outcome(lambda: wait_for_start_remote(settings, HANG, PORTS))
    assert isinstance(error, ExternalRemoteError) and f"looking up '{HANG}' timed out" in str(error), error


def test_one_lookup_per_name_is_in_flight_and_timeouts_are_not_remembered(resolver):
    for _ in range(3):
        with pytest.raises(lookup.LookupTimedOut, match=HANG):
            lookup.getaddrinfo(HANG, 80, 0.05)
    assert resolver.count(HANG) == 1
    with pytest.raises(lookup.LookupTimedOut):
        external_remote._addresses(HANG, 0.05)
    assert HANG not in external_remote._resolved  # the next poll asks again, with its own budget


def test_names_that_resolve_and_ip_literals_still_work(resolver):
    server = _serve("127.0.0.1:5556")
    resolver.clear()  # binding the endpoint looked its address up: start_remote's side
    try:
        settings = load_settings(health_host="localhost", health_port=server.address[1], remote_wait_s=10)
        assert isinstance(wait_for_start_remote(settings, "localhost", PORTS), ExternalRemote)
    finally:
        server.stop()
    assert resolver.count("localhost") == 2 and "127.0.0.1" not in resolver  # literals skip the resolver
