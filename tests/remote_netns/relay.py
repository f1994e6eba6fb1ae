"""A slow, lossy link without netem: a userspace relay that forwards Ethernet frames between two
veth ends in a third namespace, each frame ``delay_s`` late, a seeded ``loss`` share never.

Why frames and not a TCP forwarder: a TCP relay ends each connection on its own socket, so the
client's connect succeeds at once whatever the delay (``connect_timeout_s`` would never be
exercised), and loss could only be modelled inside the stream, as extra delay standing for the
retransmissions the kernel would have made. Dropping whole frames needs no model: the kernels of
both nodes see real loss and do what they do on a real link. A lost SYN is sent again after the
initial RTO (1 s), a lost segment after the RTO measured on this path (about 2 x delay plus
variance, at least 200 ms) with exponential backoff, a lost ARP request is asked again. What
start_remote sees is therefore the retransmission delay a real lossy link gives, with TCP's own
timers and ordering, and a link delayed past ``connect_timeout_s`` fails connects as a real one.

The loss is seeded (one ``random.Random(seed)`` per direction, drawn once per frame), so the
same frame sequence loses the same frames; which frames a run sends still depends on its timing.
The delay is the same for every frame, so each direction keeps its order (a FIFO suffices).

``python -m tests.remote_netns.relay DEV_A DEV_B DELAY_S LOSS SEED``, run in the relay's
namespace: prints ``relaying`` once both packet sockets are bound, and on SIGTERM one line
``frames forwarded=N dropped=M failed=K`` before it exits.

Frames are read and written with a virtio-net header (``PACKET_VNET_HDR``): veth leaves TCP
checksums to be filled in (checksum offload) and may pass segments larger than the MTU (GSO); the
header carries both facts to the other side unchanged, so no checksum is recomputed here.
"""

from __future__ import annotations

import collections
import random
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4  # a frame this namespace sent (our own forwards among them): never relayed back
FRAME_MAX = 65536 + 64


@dataclass(frozen=True)
class LinkSpec:
    """What the relay does to every frame, each way."""

    delay_s: float
    loss: float
    seed: int

    def argv(self) -> list[str]:
        return [f"{self.delay_s:g}", f"{self.loss:g}", str(self.seed)]


def _packet_socket(dev: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.bind((dev, ETH_P_ALL))
    sock.setblocking(False)
    return sock


class Relay:
    """Both directions in one loop: read what arrived, drop or queue it, send what is due."""

    def __init__(self, dev_a: str, dev_b: str, link: LinkSpec) -> None:
        self.link = link
        self.socks = (_packet_socket(dev_a), _packet_socket(dev_b))
        self.rngs = (random.Random(link.seed), random.Random(link.seed + 1))
        self.queues: tuple[collections.deque[tuple[float, bytes]], ...] = (collections.deque(), collections.deque())
        self.forwarded = self.dropped = self.failed = 0
        self.stopping = False

    def _receive(self, side: int) -> None:
        while True:
            try:
                data, address = self.socks[side].recvfrom(FRAME_MAX)
            except BlockingIOError:
                return
            if address[2] == PACKET_OUTGOING:
                continue
            if self.rngs[side].random() < self.link.loss:
                self.dropped += 1
                continue
            self.queues[side].append((time.monotonic() + self.link.delay_s, data))

    def _send_due(self, now: float) -> None:
        for side, queue in enumerate(self.queues):
            out = self.socks[1 - side]
            while queue and queue[0][0] <= now:
                try:
                    out.send(queue.popleft()[1])
                    self.forwarded += 1
                except OSError:  # the far end is down (a cut link): the frame is lost, as on a wire
                    self.failed += 1

    def run(self) -> None:
        while not self.stopping:
            due = [q[0][0] for q in self.queues if q]
            timeout = max(0.0, min(due) - time.monotonic()) if due else 0.5
            try:
                ready, _, _ = select.select(self.socks, [], [], timeout)
            except InterruptedError:
                continue
            for side, sock in enumerate(self.socks):
                if sock in ready:
                    self._receive(side)
            self._send_due(time.monotonic())

    def stats(self) -> str:
        return f"frames forwarded={self.forwarded} dropped={self.dropped} failed={self.failed}"


def parse_stats(line: str) -> dict[str, int]:
    """``frames forwarded=N dropped=M failed=K`` -> its counts."""
    words = line.split()
    assert words[:1] == ["frames"], line
    return {k: int(v) for k, v in (w.split("=") for w in words[1:])}


def main(argv: list[str]) -> None:
    dev_a, dev_b, delay_s, loss, seed = argv
    relay = Relay(dev_a, dev_b, LinkSpec(float(delay_s), float(loss), int(seed)))

    def stop(signum: int, frame: object) -> None:
        relay.stopping = True

    signal.signal(signal.SIGTERM, stop)
    print("relaying", flush=True)
    relay.run()
    print(relay.stats(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
