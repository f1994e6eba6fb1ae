"""start_remote across a slow, lossy link: 200 ms each way and 10 % of frames lost.

This kernel has no netem, so node B reaches node A through a third namespace where ``relay.py``
forwards the Ethernet frames late and drops a seeded share of them; both kernels' TCP sees real
loss and retransmits as on a real link (the relay's docstring says why that is the faithful
model). The timeouts are a slow link's deployment settings: ``master_lost_s`` must cover several
retransmission timeouts in a row (two lost copies of one heartbeat segment already cost about
0.6 + 1.2 s, past the tier's 2 s), and each connect of the master poll needs a round trip that
is not lost, so the poll is given more than one try.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ..remote.harness import ROOT, clean_env
from .conftest import Deployment, exit_10_within
from .netns import NetnsUnavailable, Node, TwoNodes, two_nodes
from .nodes import Relay
from .relay import LinkSpec

DELAY_S, LOSS, SEED = 0.2, 0.1, 28
SLOW = {"connect_timeout": 30, "handshake_timeout": 20, "probe_interval": 1, "master_lost": 8, "grace": 5}

_ECHO = """
import json, socket, sys, time
host, port, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if role == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen()
    print("listening", flush=True)
    c, _ = s.accept(); c.settimeout(30)
    while (data := c.recv(65536)):
        c.sendall(data)
else:
    payload = bytes(range(256)) * 800  # 200 KiB: a few hundred frames each way
    t = time.monotonic(); c = socket.create_connection((host, port), timeout=30); connect_s = time.monotonic() - t
    c.settimeout(30); c.sendall(payload); c.shutdown(socket.SHUT_WR)
    back = b"".join(iter(lambda: c.recv(65536), b""))
    print(json.dumps({"connect_s": connect_s, "intact": back == payload}))
"""


@pytest.fixture
def relayed_nodes(request: pytest.FixtureRequest) -> Iterator[tuple[TwoNodes, LinkSpec]]:
    link = request.param
    try:
        with two_nodes(relayed=True) as nodes:
            assert nodes.between is not None
            yield nodes, link
    except NetnsUnavailable as exc:
        pytest.skip(f"two-node tier skipped: {exc}")


def _in(node: Node, *argv: str, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen([*node.exec_prefix(), sys.executable, *argv], text=True, cwd=ROOT, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)  # type: ignore[call-overload]  # fmt: skip


@pytest.mark.parametrize(
    "relayed_nodes",
    [LinkSpec(DELAY_S, LOSS, SEED), LinkSpec(0.0, 0.0, SEED)],  # the second: the relay as a plain wire
    indirect=True,
    ids=["200ms-10pct", "plain"],
)
def test_relay_delays_every_frame_and_drops_a_seeded_share(relayed_nodes: tuple[TwoNodes, LinkSpec]):
    nodes, link = relayed_nodes
    assert nodes.between is not None
    relay = Relay(nodes.between, link)
    try:
        port = 7000 + SEED
        server = _in(nodes.a, "-c", _ECHO, nodes.a.address, str(port), "serve")
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        client = _in(nodes.b, "-c", _ECHO, nodes.a.address, str(port), "connect")
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        seen = json.loads(out)
        counts = relay.stop()
    finally:
        for proc in (relay.proc, server, client):
            proc.kill()
    assert seen["intact"]  # lost frames cost time, never bytes: TCP sent them again
    total = counts["forwarded"] + counts["dropped"]
    if link.delay_s:
        assert seen["connect_s"] >= 2 * link.delay_s, seen  # SYN and SYN-ACK, each a frame late
        assert total > 200, counts  # small segments while the window grows on a 400 ms round trip
        assert 0.05 <= counts["dropped"] / total <= 0.15, counts  # the seeded draws give 10 % to a few points
    else:  # segments up to 64 KiB (GSO): few frames
        assert seen["connect_s"] < 2 * DELAY_S and counts["dropped"] == 0 and counts["forwarded"] > 0, (seen, counts)


def _health(node: Node, port: int) -> tuple[int, dict[str, object]]:
    """GET / of start_remote's health endpoint, asked on ``node`` (it listens on that node's 127.0.0.1)."""
    code = (
        "import json, sys, urllib.error, urllib.request\n"
        "try:\n"
        f"    r = urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=5); status, body = r.status, r.read()\n"
        "except urllib.error.HTTPError as e:\n"
        "    status, body = e.code, e.read()\n"
        "print(status); print(body.decode())\n"
    )
    done = subprocess.run([*node.exec_prefix(), sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=20, cwd=ROOT, env=clean_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    status, body = done.stdout.split("\n", 1)
    return int(status), json.loads(body)


@pytest.mark.link(delay_s=DELAY_S, loss=LOSS, seed=SEED)
def test_start_remote_over_a_slow_lossy_link_reaches_ready_stays_ready_and_exits_0(deployment: Deployment):
    health_port = 18000 + deployment.ports[0] % 1000
    master = deployment.master()
    remote = deployment.start_remote(health_port=health_port, **SLOW)
    remote.register(2)
    master.wait_line("bound")
    remote.wait_state("waiting_for_master")
    remote.wait_state("ready", 60)
    ready_at = time.monotonic()
    status, body = _health(deployment.nodes.b, health_port)
    assert status == 200 and body["state"] == "ready", body
    # FlexKV's is_ready() across the link: its engine asks until True, and on this link one query or
    # its answer can be lost to a retransmission past FlexKV's own wait, so ask as the engine does, and
    # judge that asking (asking once more after a True would be one more draw of the same loss)
    asked_until, answers = time.monotonic() + 30, list[bool]()
    while not any(answers) and time.monotonic() < asked_until:
        if answers:
            time.sleep(0.5)
        answers.append(master.is_ready(10))
    assert answers[-1] is True, (answers, master.out.text()[-2000:], master.err.text()[-2000:])
    code, _ = remote.exit(max(0.0, ready_at + SLOW["master_lost"] + 1 - time.monotonic()))  # past a heartbeat timeout
    assert code is None and remote.in_state("ready"), remote.err.text()[-3000:]
    remote.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code, at, err = remote.finish(SLOW["grace"] + 5)
    assert code == 0, err[-3000:]
    assert at - sent < SLOW["grace"], at - sent
    assert deployment.relay is not None
    counts = deployment.relay.stop()
    assert counts["dropped"] > 0, counts  # the link did lose frames on the way


@pytest.mark.link(delay_s=1.0, loss=0.0, seed=SEED)
def test_a_link_slower_than_connect_timeout_is_exit_10(deployment: Deployment):
    """Negative control of the slow link: a round trip (2 s, ARP and SYN each one) longer than
    connect_timeout_s, so no connect completes and start_remote exits 10 on time."""
    exit_10_within(deployment, lambda: None, 1.5)


_WAIT = """
import sys, time
from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.remote import preflight
s = load_settings(master_host=sys.argv[1], master_ports=sys.argv[2], nnodes=2, node_rank=1, connect_timeout_s=20)
t = time.monotonic()
preflight.wait_for_master(s, lambda w: time.sleep(w) or False)
print(time.monotonic() - t)
"""


@pytest.mark.link(delay_s=0.6, loss=0.0, seed=SEED)
def test_the_master_poll_connects_over_a_round_trip_longer_than_a_second(deployment: Deployment):
    """Each connect is given what is left of connect_timeout_s: with a 1.2 s round trip (a fixed 1 s cap per
    connect attempt never completed one), the master's ports are reached well before the deadline."""
    master = deployment.master()
    master.wait_line("bound")
    poll = _in(deployment.nodes.b, "-c", _WAIT, deployment.nodes.a.address, ",".join(map(str, deployment.ports)))
    out, err = poll.communicate(timeout=60)
    assert poll.returncode == 0, err[-2000:]
    assert 3 * 1.2 <= float(out) < 20, out  # three connects, each at least one round trip
