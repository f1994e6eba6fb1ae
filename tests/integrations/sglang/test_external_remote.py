"""``remote: external``: waiting for start_remote's health endpoint / ready file instead of spawning a remote."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import load_settings
from flexkv_adapter.integrations.sglang.external_remote import (
    ExternalRemote,
    ExternalRemoteError,
    _parse,
    probe_ready_file,
    wait_for_start_remote,
)
from flexkv_adapter.remote.health import HealthServer
from flexkv_adapter.remote.states import State, StateTracker

from ...bounded_call import in_thread

PORTS = ("5556", "5557", "5558")


@pytest.fixture
def health():
    """start_remote's real state tracker and health endpoint (503 + JSON body until ready)."""
    tracker = StateTracker({"master": "10.0.0.1:5556", "node_rank": 1})
    server = HealthServer(tracker, "127.0.0.1", 0)
    server.start()
    yield tracker, server.address[1]
    server.stop()


def _wait(**settings):
    return wait_for_start_remote(load_settings(**settings), "10.0.0.1", PORTS, poll_s=0.05)


@pytest.mark.parametrize("state", [State.WAITING_FOR_GPUS, State.READY])
def test_proceeds_once_start_remote_waits_for_gpus_or_is_ready(health, state):
    tracker, port = health
    tracker.set(State.HANDSHAKE)
    threading.Timer(0.3, tracker.set, (state,)).start()
    start = time.monotonic()
    handle = _wait(health_port=port, remote_wait_s=5)
    assert time.monotonic() - start >= 0.25
    assert isinstance(handle, ExternalRemote) and f"state {state.value}" in handle.source
    handle.terminate(), handle.kill(), handle.close()
    assert handle.join(timeout=5.0) is None and handle.is_alive() is False and handle.pid is None


def test_a_failed_start_remote_is_reported_at_once(health):
    tracker, port = health
    tracker.set(State.FAILED, "master unreachable")
    with pytest.raises(ExternalRemoteError, match="reports .*state failed \\(master unreachable\\)"):
        _wait(health_port=port, remote_wait_s=30)


def test_a_start_remote_stuck_before_the_master_hits_the_deadline(health):
    tracker, port = health
    tracker.set(State.WAITING_FOR_MASTER)
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match="did not reach waiting_for_gpus .*state waiting_for_master"):
        _wait(health_port=port, remote_wait_s=0.4)
    assert time.monotonic() - start < 3


def test_nothing_listening_names_start_remote_within_the_absent_deadline(unused_port):
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match="scripts/start_remote.py is not running on this node"):
        _wait(health_port=unused_port, remote_absent_s=0.3, remote_wait_s=60)
    assert time.monotonic() - start < 3


@pytest.mark.parametrize(
    ("host", "ports", "refused"),
    [("10.0.0.1", ("6000", "6001", "6002"), True), ("10.0.0.2", PORTS, True), ("10.0.0.1", PORTS, False)],
)
def test_a_start_remote_serving_another_master_is_refused(health, host, ports, refused):
    tracker, port = health
    tracker.set(State.READY)
    if not refused:
        assert isinstance(wait_for_start_remote(load_settings(health_port=port), host, ports), ExternalRemote)
        return
    with pytest.raises(ExternalRemoteError, match="serves master 10.0.0.1:5556 but the engine's FlexKV uses"):
        wait_for_start_remote(load_settings(health_port=port), host, ports)


def test_master_names_are_compared_by_address():
    from flexkv_adapter.integrations.sglang.external_remote import _same_host

    assert _same_host("localhost", "127.0.0.1", 30) and not _same_host("10.0.0.1", "10.0.0.2", 30)
    assert _same_host("no-such-host.invalid", "10.0.0.1", 30)  # cannot tell: not refused on a guess


def test_without_health_port_or_ready_file_it_refuses_before_waiting():
    with pytest.raises(ExternalRemoteError, match="needs start_remote's health_port in the settings"):
        _wait()


def test_ready_file_of_a_live_start_remote(tmp_path):
    ready = tmp_path / "remote.ready"
    ready.write_text(json.dumps({"state": "ready", "pid": os.getpid(), "master": "10.0.0.1:5556"}))
    assert isinstance(_wait(ready_file=str(ready)), ExternalRemote)


def test_stale_ready_file_is_not_trusted(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ready = tmp_path / "remote.ready"
    ready.write_text(json.dumps({"state": "ready", "pid": dead.pid}))
    assert probe_ready_file(ready).state is None
    with pytest.raises(ExternalRemoteError, match="stale ready file"):
        _wait(ready_file=str(ready), remote_absent_s=30)  # at once: see below


def test_ready_file_alone_does_not_wait_for_what_cannot_come(tmp_path):
    """start_remote writes it only once this node's GPUs registered, after the engine's wait: no deadlock."""
    start = time.monotonic()
    with pytest.raises(ExternalRemoteError, match="set health_port"):
        _wait(ready_file=str(tmp_path / "absent.ready"), remote_absent_s=30, remote_wait_s=60)
    assert time.monotonic() - start < 2


def test_a_non_json_health_answer_is_not_taken_for_a_state(unused_port):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>ok</html>")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ExternalRemoteError, match="without a JSON state"):
            _wait(health_port=server.server_address[1], remote_absent_s=0.5)
    finally:
        server.shutdown()
        server.server_close()


@given(st.one_of(st.binary(max_size=64), st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text())))
def test_any_answer_parses_to_a_state_or_none(body):
    """Whatever answers on the port, probing never raises and only a JSON object's string state counts."""
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    expected = data["state"] if isinstance(data, dict) and isinstance(data.get("state"), str) else None
    assert _parse(raw, "x").state == expected


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_local_endpoint_is_not_asked_through_a_proxy(health, monkeypatch):
    tracker, port = health
    tracker.set(State.WAITING_FOR_GPUS)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a proxy that refuses everything
    monkeypatch.setenv("no_proxy", "")
    assert isinstance(_wait(health_port=port, remote_absent_s=2), ExternalRemote)


def test_a_health_port_that_streams_forever_does_not_hang_the_engine():
    """Another service on health_port (an event stream, a mis-set port) must not block past remote_wait_s."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            while not stop.is_set():
                try:
                    self.wfile.write(b"data: tick\n" * 100)
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.01)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done, result = in_thread(
            lambda: _wait(health_port=server.server_address[1], remote_absent_s=0.5, remote_wait_s=1), 10
        )
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert done, "wait_for_start_remote still reading the stream after 10 s"
    assert isinstance(result, ExternalRemoteError), result


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_ready_file_that_is_a_fifo_does_not_hang_the_engine(tmp_path):
    fifo = tmp_path / "remote.ready"
    os.mkfifo(fifo)
    try:
        done, result = in_thread(lambda: _wait(ready_file=str(fifo), remote_absent_s=0.2, remote_wait_s=0.5), 5)
    finally:
        with contextlib.suppress(OSError):  # release a reader blocked in open()
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert done, "wait_for_start_remote blocked opening the FIFO"
    assert isinstance(result, ExternalRemoteError), result
