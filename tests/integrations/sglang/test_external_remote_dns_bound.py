"""The engine's name lookups (``health_host``, the master's name) end by its deadline, whatever the
resolver does: a resolver that never answers is a ``socket.getaddrinfo`` blocked on an Event."""

from __future__ import annotations

import itertools
import socket
import threading
from types import SimpleNamespace

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.config import lookup
from flexkv_adapter.integrations.sglang import external_remote
from flexkv_adapter.integrations.sglang.external_remote import (
    ExternalRemote,
    ExternalRemoteError,
    wait_for_start_remote,
)
from flexkv_adapter.remote.health import HealthServer
from flexkv_adapter.remote.states import State, StateTracker

from ...bounded_call import outcome_within

PORTS = ("5556", "5557", "5558")
_names = itertools.count()
BOUND_S = 20.0  # generous: without the bound the call never returns at all


@pytest.fixture
def resolver(monkeypatch):
    """``socket.getaddrinfo`` that blocks for ``.hang`` (a name of this test alone, so no lookup of an
    earlier test is joined) until the test ends, and lists in ``.calls`` the names it was asked to look
    up. As the real one, it answers AI_NUMERICHOST calls without the resolver."""
    real, release, calls = socket.getaddrinfo, threading.Event(), []
    hang = f"hangs-{next(_names)}.in-the-resolver.test"

    def blocking(host, *args, **kwargs):
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, *args, **kwargs)
        calls.append(host)
        if host == hang:
            release.wait()
            raise socket.gaierror(socket.EAI_NONAME, "released")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", blocking)
    monkeypatch.setattr(external_remote, "_resolved", {}, raising=False)
    yield SimpleNamespace(hang=hang, calls=calls)
    release.set()


def _outcome(call):
    return outcome_within(call, BOUND_S, "the lookup has no deadline")


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
    hang = resolver.hang
    settings = load_settings(health_host=hang, health_port=endpoint, remote_wait_s=0.5, remote_absent_s=0.5)
    error = _outcome(lambda: wait_for_start_remote(settings, "10.0.0.1", PORTS, poll_s=0.05))
    assert isinstance(error, ExternalRemoteError), error
    assert "start_remote" in str(error) and f"looking up '{hang}' timed out" in str(error)
    assert resolver.calls.count(hang) == 1  # one lookup in flight per name, not one per poll


def test_a_master_name_that_hangs_in_the_resolver_ends_by_remote_wait_s(resolver, endpoint):
    hang = resolver.hang
    settings = load_settings(health_port=endpoint, remote_wait_s=0.5, remote_absent_s=0.5)
    error = _outcome(lambda: wait_for_start_remote(settings, hang, PORTS, poll_s=0.05))
    assert isinstance(error, ExternalRemoteError), error
    text = str(error)
    assert "start_remote answered" in text and f"its master 10.0.0.1:5556 is the engine's {hang}:5556" in text
    assert f"looking up '{hang}' timed out" in text


def test_a_master_name_that_hangs_is_bounded_in_the_ready_file_path_too(resolver, tmp_path):
    hang = resolver.hang
    ready = tmp_path / "ready.json"
    ready.write_text(f'{{"state": "ready", "master": "10.0.0.1:5556", "pid": {__import__("os").getpid()}}}')
    settings = load_settings(ready_file=ready, remote_wait_s=0.5)
    error = _outcome(lambda: wait_for_start_remote(settings, hang, PORTS))
    assert isinstance(error, ExternalRemoteError) and f"looking up '{hang}' timed out" in str(error), error


def test_one_lookup_per_name_is_in_flight_and_timeouts_are_not_remembered(resolver):
    hang = resolver.hang
    for _ in range(3):
        with pytest.raises(lookup.LookupTimedOut, match=hang):
            lookup.getaddrinfo(hang, 80, 0.05)
    assert resolver.calls.count(hang) == 1
    with pytest.raises(lookup.LookupTimedOut):
        external_remote._addresses(hang, 0.05)
    assert hang not in external_remote._resolved  # the next poll asks again, with its own budget


def test_names_that_resolve_and_ip_literals_still_work(resolver):
    server = _serve("127.0.0.1:5556")
    resolver.calls.clear()  # binding the endpoint looked its address up: start_remote's side
    try:
        settings = load_settings(health_host="localhost", health_port=server.address[1], remote_wait_s=10)
        assert isinstance(wait_for_start_remote(settings, "localhost", PORTS), ExternalRemote)
    finally:
        server.stop()
    assert resolver.calls.count("localhost") == 2 and "127.0.0.1" not in resolver.calls  # literals skip the resolver
