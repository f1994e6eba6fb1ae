"""``remote: external`` against hostile health ports and a start_remote that goes away (real sockets).

Every case must end in ``ExternalRemoteError`` (prefixed, naming start_remote) or a handle, within
the deadline, whatever the port sends and however slowly.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from flexkv_adapter import load_settings
from flexkv_adapter.integrations.sglang.external_remote import (
    ExternalRemoteError,
    probe_health,
    probe_ready_file,
    wait_for_start_remote,
)
from flexkv_adapter.remote.health import HealthServer
from flexkv_adapter.remote.states import StateTracker

PORTS = ("5556", "5557", "5558")


@contextlib.contextmanager
def serving(answer):
    """A TCP port whose every connection is handled by ``answer(conn)`` in a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_quietly, args=(answer, conn), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def _quietly(answer, conn) -> None:
    with contextlib.suppress(OSError), conn:
        answer(conn)


def _http(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.0 503 Service Unavailable", *extra, b"Content-Length: %d" % len(body)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _trickle(data: bytes, step: int, pause: float):
    def answer(conn) -> None:
        for i in range(0, len(data), step):
            conn.sendall(data[i : i + step])
            time.sleep(pause)

    return answer


HOSTILE = {
    "ssh banner": lambda c: c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n"),
    "150 headers": lambda c: c.sendall(
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n{}"
    ),
    "bad chunked body": lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    "deep json": lambda c: c.sendall(_http(b"[" * 60000 + b"]" * 60000)),
    "short body": lambda c: c.sendall(_http(b'{"state": "ready"}')[:-5]),
    "headers without end": lambda c: c.sendall(b"HTTP/1.0 200 OK\r\n" + b"X: y\r\n" * 3000),
    "trickled bytes": _trickle(_http(b'{"state": "ready"}'), 4, 0.15),  # each pause under a read timeout
    "one header line at a time": _trickle(_http(b"{}", *[b"X-A: b"] * 40), 8, 0.15),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_health_port_ends_in_the_prefixed_error_within_the_deadline(name):
    with serving(HOSTILE[name]) as port:
        settings = load_settings(health_port=port, remote_wait_s=0.5, remote_absent_s=0.5)
        start = time.monotonic()
        with pytest.raises(ExternalRemoteError, match="start_remote") as caught:
            wait_for_start_remote(settings, "10.0.0.1", PORTS, poll_s=0.05)
        assert time.monotonic() - start < 1.2, name
    assert "remote_absent_s=0.5" in str(caught.value) or "remote_wait_s=0.5" in str(caught.value)


def test_one_probe_is_bounded_in_total_not_per_read():
    with serving(_trickle(_http(b'{"state": "ready"}'), 1, 0.05)) as port:
        start = time.monotonic()
        probe = probe_health("127.0.0.1", port, timeout_s=0.5)
        assert time.monotonic() - start < 0.9
    assert probe.state is None and "timed out" in probe.seen


def test_the_real_endpoint_still_answers_through_the_bounded_probe():
    tracker = StateTracker({"master": "10.0.0.1:5556", "node_rank": 1})
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    try:
        probe = probe_health("127.0.0.1", server.address[1], timeout_s=2)
        assert probe.state == "waiting_for_master" and probe.pid == os.getpid()
    finally:
        server.stop()


def test_a_ready_file_with_an_impossible_pid_is_stale_not_an_overflow(tmp_path):
    path = tmp_path / "ready.json"
    for pid in (2**40, 2**63, 2**70):
        path.write_text(json.dumps({"state": "ready", "pid": pid, "master": "10.0.0.1:5556"}))
        probe = probe_ready_file(path)
        assert probe.state is None and "stale" in probe.seen
        settings = load_settings(ready_file=path, remote_wait_s=0.2, remote_absent_s=0.2)
        with pytest.raises(ExternalRemoteError, match="start_remote"):
            wait_for_start_remote(settings, "10.0.0.1", PORTS, poll_s=0.05)


_FAKE_REMOTE = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"state": "handshake", "pid": __import__("os").getpid(), "master": "10.0.0.1:5556"}).encode()
        self.send_response(503); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
server = HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.handle_request()  # answers once, then the process ends (killed after answering)
"""


def test_a_start_remote_that_ends_after_answering_is_noticed_at_once():
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_REMOTE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        settings = load_settings(health_port=port, remote_wait_s=30, remote_absent_s=20)
        start = time.monotonic()
        with pytest.raises(ExternalRemoteError, match="went away after answering") as caught:
            wait_for_start_remote(settings, "10.0.0.1", PORTS, poll_s=0.05)
        assert time.monotonic() - start < 5
        assert f"pid {proc.pid}" in str(caught.value) and "handshake" in str(caught.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_start_remote_that_falls_silent_is_given_up_after_remote_absent_s():
    tracker = StateTracker({"master": "10.0.0.1:5556", "node_rank": 1})
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    port = server.address[1]
    threading.Timer(0.3, server.stop).start()  # still alive (this pid), but no longer answering
    settings = load_settings(health_port=port, remote_wait_s=30, remote_absent_s=0.6)
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match="went away after answering .silent for remote_absent_s=0.6"):
        wait_for_start_remote(settings, "10.0.0.1", PORTS, poll_s=0.05)
    assert time.monotonic() - start < 3


def test_nul_in_a_path_setting_is_a_settings_error_not_a_raw_value_error(tmp_path):
    from flexkv_adapter.errors import SettingsError

    config = tmp_path / "c.yaml"
    for key in ("ready_file", "lock_dir", "server_recv_port", "health_host", "master_host"):
        config.write_text(f'{key}: "/tmp/a\\0b"\n')
        with pytest.raises(SettingsError, match=f"{key}=.*NUL"):
            load_settings(config)


@pytest.mark.parametrize(
    ("key", "value"), [("master_lost_s", 3000000), ("probe_interval_s", 2200000), ("remote_wait_s", 2e9)]
)
def test_a_duration_its_consumer_cannot_take_is_refused_at_load(key, value):
    from flexkv_adapter.errors import SettingsError

    with pytest.raises(SettingsError, match=key):
        load_settings(**{key: value})


def test_a_real_start_remote_killed_after_answering_is_reported_gone(tmp_path):
    from ...remote.harness import Remote

    remote = Remote(tmp_path)  # no master: it answers waiting_for_master until connect_timeout
    remote.wait_state("waiting_for_master")
    threading.Timer(0.3, remote.proc.kill).start()
    settings = load_settings(health_port=remote.health_port, remote_wait_s=60, remote_absent_s=30)
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match=rf"went away after answering \(its process \(pid {remote.proc.pid}"):
        wait_for_start_remote(settings, "127.0.0.1", [str(p) for p in remote.ports], poll_s=0.05)
    assert time.monotonic() - start < 5
    assert remote.finish()[0] == -9


def test_an_ipc_server_port_too_long_for_a_unix_socket_is_refused_at_load():
    from flexkv_adapter.errors import SettingsError

    fits = "ipc:///" + "a" * (107 - 1 - len("_gpu_register_control"))
    assert load_settings(server_recv_port=fits).server_recv_port == fits
    with pytest.raises(SettingsError, match="server_recv_port=.*at most 107"):
        load_settings(server_recv_port=fits + "a")
