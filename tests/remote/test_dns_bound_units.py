"""Each name lookup outside the engine ends by its bound (start_remote's lock key, spawn check, health
bind, master ports; ``flexkv-adapter doctor``), and the engine asks again after a transient failure.
A resolver that never answers is a ``socket.getaddrinfo`` (and ``gethostbyname``) blocked on an Event."""

from __future__ import annotations

import itertools
import socket
import threading
from types import SimpleNamespace

import pytest

from flexkv_adapter.cli import doctor
from flexkv_adapter.config import lookup
from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.integrations.sglang import external_remote
from flexkv_adapter.remote import lock, preflight, spawns
from flexkv_adapter.remote.exit_codes import ExitCode, RemoteExit
from flexkv_adapter.remote.health import HealthServer
from flexkv_adapter.remote.states import StateTracker

from ..bounded_call import outcome_within

_names = itertools.count()
BOUND_S = 20.0  # generous: without the bound the call never returns at all
PORTS = (5556, 5557, 5558)


@pytest.fixture
def resolver(monkeypatch):
    """Lookups of ``.hang`` (a name of this test alone) block until the test ends; numeric ones and other
    names go to the real resolver."""
    real_info, real_name, release = socket.getaddrinfo, socket.gethostbyname, threading.Event()
    hang = f"hangs-{next(_names)}.in-the-resolver.test"

    def getaddrinfo(host, *args, **kwargs):
        if host == hang and not kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            release.wait()
            raise socket.gaierror(socket.EAI_NONAME, "released")
        return real_info(host, *args, **kwargs)

    def gethostbyname(host):
        if host == hang:
            release.wait()
        return real_name(host)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "gethostbyname", gethostbyname)
    yield SimpleNamespace(hang=hang)
    release.set()
    for thread in threading.enumerate():  # the lookups end once answered: no thread is left behind
        if thread.name.startswith("lookup hangs-"):
            thread.join(BOUND_S)
            assert not thread.is_alive()


def _outcome(call):
    return outcome_within(call, BOUND_S, "the lookup has no bound")


def test_doctor_reports_a_master_that_did_not_resolve_within_its_bound(resolver, monkeypatch):
    assert doctor.LOOKUP_S == 5.0
    monkeypatch.setattr(doctor, "LOOKUP_S", 0.2)
    s = load_settings(nnodes=2, node_rank=1, master_host=resolver.hang)
    checks = _outcome(lambda: doctor.settings_checks(s))
    assert not isinstance(checks, BaseException), checks
    master = [c for c in checks if c.name == "master_host"]
    assert len(master) == 1 and master[0].status == "error", master
    assert f"{resolver.hang} did not resolve within 0.2 s" in master[0].detail


def test_start_remote_lookups_of_the_master_raise_by_their_bound(resolver):
    for call in (
        lambda: lock.lock_key(resolver.hang, PORTS, 0.2),
        lambda: spawns.classify_spawns(resolver.hang, PORTS, 0.2),
    ):
        raised = _outcome(call)
        assert isinstance(raised, lookup.LookupTimedOut) and resolver.hang in str(raised), raised
    failed = _outcome(lambda: preflight.unreachable_ports(resolver.hang, PORTS, 0.2))
    assert isinstance(failed, dict) and set(failed) == set(PORTS), failed
    assert all("timed out" in why and resolver.hang in why for why in failed.values())


def test_the_preflight_ends_with_exit_10_naming_the_host_and_connect_timeout(resolver):
    s = load_settings(nnodes=2, node_rank=1, master_host=resolver.hang, connect_timeout_s=0.2)
    raised = _outcome(lambda: preflight.validate(s))
    assert isinstance(raised, RemoteExit) and raised.code == ExitCode.MASTER_UNREACHABLE, raised
    assert f"master_host {resolver.hang!r} did not resolve within connect_timeout_s=0.2 s" in str(raised)


def test_the_health_endpoint_cannot_listen_on_a_name_that_does_not_resolve_in_time(resolver):
    raised = _outcome(lambda: HealthServer(StateTracker({}), resolver.hang, 0, 0.2))
    assert isinstance(raised, RemoteExit) and raised.code == ExitCode.HEALTH_ENDPOINT, raised
    assert resolver.hang in str(raised)
    server = HealthServer(StateTracker({}), "localhost", 0, 5.0)  # a name that resolves still binds
    assert server.address[0] in ("127.0.0.1", "::1")
    server.start()
    server.stop()


def test_a_transient_failure_is_asked_again_on_the_next_poll_and_a_missing_name_is_not(monkeypatch):
    real, asked = socket.getaddrinfo, []
    name, gone = f"flaky-{next(_names)}.test", f"gone-{next(_names)}.test"
    answers = iter([socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")])

    def flaky(host, port, *args, **kwargs):
        if host not in (name, gone) or kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        if host == gone:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        failure = next(answers, None)
        if failure is not None:
            raise failure
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", flaky)
    monkeypatch.setattr(external_remote, "_resolved", {})
    assert external_remote._same_host(name, "10.0.0.1", 5.0)  # EAI_AGAIN: not judged on this poll
    assert not external_remote._same_host(name, "10.0.0.1", 5.0)  # the next poll asks again: another host
    assert external_remote._same_host(gone, "10.0.0.1", 5.0)  # does not exist: not judged, and remembered
    assert external_remote._same_host(gone, "10.0.0.1", 5.0)
    assert asked == [name, name, gone]
    assert lookup.transient(socket.gaierror(socket.EAI_AGAIN, "x"))
    assert not lookup.transient(socket.gaierror(socket.EAI_NONAME, "x")) and not lookup.transient(UnicodeError())
