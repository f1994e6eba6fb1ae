"""``preflight.wait_for_master`` against a master that silently drops packets: exit 10 on time.

A refused connection fails at once, so loopback tests never showed that each port's connect could
wait its whole timeout past ``connect_timeout_s``. A listening socket whose accept queue is full
drops every further SYN, as a black-holed master does: connects to it only time out.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.remote import preflight
from flexkv_adapter.remote.exit_codes import ExitCode, RemoteExit


@contextlib.contextmanager
def black_holes(n: int) -> Iterator[list[int]]:
    """``n`` ports that never complete a TCP handshake (listen(0) with its one queue slot taken)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            listener = stack.enter_context(socket.socket())
            listener.bind(("127.0.0.1", 0))
            listener.listen(0)
            filler = stack.enter_context(socket.create_connection(listener.getsockname(), timeout=2))
            assert filler is not None
            ports.append(listener.getsockname()[1])
        probe = socket.socket()
        probe.settimeout(0.2)
        with probe, pytest.raises(TimeoutError):  # the hole holds: a further connect hangs
            probe.connect(("127.0.0.1", ports[0]))
        yield ports


def _settings(ports: list[int], connect_timeout_s: float):
    return load_settings(
        master_host="127.0.0.1",
        master_ports=",".join(map(str, ports)),
        nnodes=2,
        node_rank=1,
        allow_loopback_master=True,
        connect_timeout_s=connect_timeout_s,
    )


def _never_stop(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def test_a_black_holed_master_ends_in_exit_10_within_connect_timeout():
    """The first port's connect is given what is left of ``connect_timeout_s`` (no fixed cap: a slow link's
    round trip may be longer than any), so it waits until the deadline and the poll ends in exit 10 on time."""
    connect_timeout_s = 1.2
    with black_holes(3) as ports:
        start = time.monotonic()
        with pytest.raises(RemoteExit) as raised:
            preflight.wait_for_master(_settings(ports, connect_timeout_s), _never_stop)
        took = time.monotonic() - start
    assert raised.value.code is ExitCode.MASTER_UNREACHABLE
    assert connect_timeout_s - 0.05 <= took <= connect_timeout_s + 0.3, took
    assert "not reachable within" in str(raised.value)
    assert f"{ports[1]}: not tried" in str(raised.value)  # the first port had the whole budget


def test_each_port_gets_at_most_what_is_left_and_the_rest_is_reported_untried():
    with black_holes(3) as ports:
        start = time.monotonic()
        failed = preflight.unreachable_ports("127.0.0.1", tuple(ports), timeout=1.0, within_s=0.5)
        took = time.monotonic() - start
    assert took <= 0.8, took
    assert set(failed) == set(ports)
    assert "timed out" in failed[ports[0]] or "TimeoutError" in failed[ports[0]]
    assert all("not tried" in failed[p] for p in ports[1:]), failed


def test_a_master_that_accepts_is_reached_on_the_first_poll():
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    try:
        ports = [s.getsockname()[1] for s in listeners]
        start = time.monotonic()
        preflight.wait_for_master(_settings(ports, 2), _never_stop)
        assert time.monotonic() - start < 1
    finally:
        for s in listeners:
            s.close()
