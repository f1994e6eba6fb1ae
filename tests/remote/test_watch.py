"""MasterWatch on real sockets: a master that answers ZMTP, one that only accepts TCP, one gone."""

from __future__ import annotations

import socket
import time

import zmq

from flexkv_adapter.remote.watch import MasterWatch

LOST_S = 1.0


def _poll_lost(watch: MasterWatch, within_s: float) -> tuple[str | None, float]:
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        why = watch.lost()
        if why:
            return why, time.monotonic() - started
        time.sleep(0.02)
    return None, time.monotonic() - started


def test_a_master_that_answers_heartbeats_is_not_lost_and_its_end_is_noticed():
    ctx = zmq.Context(1)
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    watch = MasterWatch("127.0.0.1", port, 0.1, LOST_S)
    why, _ = _poll_lost(watch, LOST_S * 2.5)
    assert why is None  # heartbeats answered for longer than master_lost_s
    pull.close()
    ctx.term()
    why, took = _poll_lost(watch, LOST_S + 3)
    assert why is not None and "connection closed" in why, why
    assert took < LOST_S + 1.5, took


def test_a_master_port_that_accepts_tcp_but_never_finishes_zmtp_is_lost_within_master_lost():
    """TCP connected, handshake never done: heartbeats never start, so only the handshake bound
    (master_lost_s, not libzmq's 30 s default) and the first-handshake deadline notice it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    watch = MasterWatch("127.0.0.1", listener.getsockname()[1], 0.1, LOST_S)
    accepted, _ = listener.accept()  # the TCP connection stands: the case the old watch took as connected
    try:
        why, took = _poll_lost(watch, LOST_S + 3)
        assert why is not None and "no connection" in why, why
        assert took <= LOST_S + 0.5, took
    finally:
        accepted.close()
        listener.close()


def test_nothing_listening_is_lost_after_master_lost_not_before():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    watch = MasterWatch("127.0.0.1", port, 0.1, LOST_S)
    why, took = _poll_lost(watch, LOST_S + 3)
    assert why is not None and "no connection" in why, why
    assert LOST_S - 0.1 <= took <= LOST_S + 0.5, took
