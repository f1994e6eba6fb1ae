"""start_remote's health endpoint against hostile clients: trickling bytes, resets, odd requests."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from flexkv_adapter.remote import health
from flexkv_adapter.remote.exit_codes import ExitCode
from flexkv_adapter.remote.health import HealthServer
from flexkv_adapter.remote.states import StateTracker

from .harness import free_ports
from .test_host import startup


def test_a_slow_loris_health_client_is_cut_at_a_total_deadline(monkeypatch):
    """One byte at a time, each within the read timeout, must not hold a connection slot for ever."""
    monkeypatch.setattr(health, "REQUEST_DEADLINE_S", 1.0)
    server = HealthServer(StateTracker({}), "127.0.0.1", 0)
    server.start()
    client = socket.create_connection(("127.0.0.1", server.address[1]))
    started = time.monotonic()
    try:
        with pytest.raises(OSError):
            for byte in b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * 100:
                client.send(bytes([byte]))
                time.sleep(0.2)
                assert time.monotonic() - started < 3, "the trickling client is still connected"
    finally:
        client.close()
        server.stop()


def test_reset_or_odd_health_requests_are_answered_without_a_traceback(capfd):
    server = HealthServer(StateTracker({}), "127.0.0.1", 0)
    server.start()
    port = server.address[1]
    answers = []
    try:
        for _ in range(20):  # request, then RST before the answer is written
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.send(b"GET / HTTP/1.0\r\n\r\n")
            s.close()
        for request in (
            b"HEAD / HTTP/1.0\r\n\r\n",
            b"POST / HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello",
            b"\x00\xff\r\n\r\n",
            b"GET / HTTP/1.0\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
            b"GET / HTTP/1.0\r\n" + b"X: a\r\n" * 200 + b"\r\n",
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                s.sendall(request)
                answers.append(s.recv(64).split(b"\r\n")[0])
        time.sleep(0.3)
    finally:
        server.stop()
    assert answers[0] == b"HTTP/1.0 503 Service Unavailable", answers  # HEAD: the status, no body
    assert [a.split()[1] for a in answers[1:] if a.startswith(b"HTTP/")] == [b"501", b"431", b"431"], answers
    assert "Traceback" not in capfd.readouterr().err


def test_a_health_host_that_cannot_be_encoded_exits_2_at_load(tmp_path):
    """Refused with the settings (exit 2), before any lock or port: the resolver could never take it."""
    code, line = startup(tmp_path, health_port=free_ports(1)[0], health_host="a" * 70 + ".example")
    assert code == ExitCode.SETTINGS and "health_host" in line and "resolver can take" in line, line


def test_binding_the_health_endpoint_makes_no_dns_lookup(monkeypatch):
    """HTTPServer.server_bind calls getfqdn() on the main thread, where a slow resolver delays signals."""

    def no_dns(*args):
        raise AssertionError("getfqdn called")

    monkeypatch.setattr(socket, "getfqdn", no_dns)
    server = HealthServer(StateTracker({}), "127.0.0.1", 0)
    server.start()
    try:
        assert server._server.server_name == "127.0.0.1" and server._server.server_port == server.address[1]
        with socket.create_connection(("127.0.0.1", server.address[1]), timeout=2) as client:
            client.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.0 503")
    finally:
        server.stop()
