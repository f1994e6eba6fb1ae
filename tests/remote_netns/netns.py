"""Two "nodes" on one machine: two network namespaces joined by a veth pair, and the faults.

Names are unique per run (pid and a random tag), so two runs on one machine never share a
namespace or a link, and each pair gets a random subnet (``10.213.<random>.<4k+1,4k+2>/30``).
Namespaces of a run that was killed before its clean-up are removed by the next run. :func:`two_nodes` deletes both
namespaces (and with them the veth pair) in a ``finally``, whatever happened. Every ``ip`` call
ends within ``IP_TIMEOUT_S``. For a slow or lossy link (this kernel has no netem), a third
namespace sits between them and ``relay.py`` forwards the frames there.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

IP_TIMEOUT_S = 10.0
PREFIX = "fkv2n-"  # fkv2n-<pid>-<tag>-a|b|r: the pid tells a live run's namespaces from a dead one's
UNUSED_MAC = "02:00:5e:00:28:01"  # locally administered, on no interface: frames to it go nowhere


class NetnsUnavailable(Exception):
    """``ip netns add`` was refused here (not root, no iproute2, no namespaces): the tier is skipped."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Node:
    netns: str
    dev: str
    address: str

    def exec_prefix(self) -> list[str]:
        """Argv prefix that runs a command on this node (in its network namespace)."""
        return ["ip", "netns", "exec", self.netns]


@dataclass(frozen=True)
class Between:
    """A third namespace on the link (``two_nodes(relayed=True)``): one veth end towards each node,
    no address; ``relay.py`` forwards the frames between ``dev_a`` and ``dev_b``."""

    netns: str
    dev_a: str
    dev_b: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]


@dataclass(frozen=True)
class TwoNodes:
    """Node A (the master's, node 0) and node B (start_remote's, node 1), one link between them:
    a veth pair, or, relayed, A's veth to ``between`` and ``between``'s other veth to B."""

    a: Node
    b: Node
    between: Between | None = None

    def link(self, up: bool) -> None:
        """Cut (or restore) the link: B's end down takes the carrier off both ends."""
        ip("-n", self.b.netns, "link", "set", self.b.dev, "up" if up else "down")

    def black_hole(self, on: bool) -> None:
        """A silent black hole: each node sends its frames for the other to a MAC nobody has, and
        the link stays up. Both ways: one way alone still delivers what node A sends (the config)."""
        for here, there in ((self.b, self.a), (self.a, self.b)):
            if on:
                ip("-n", here.netns, "neigh", "replace", there.address, "lladdr", UNUSED_MAC, "dev", here.dev,
                   "nud", "permanent")  # fmt: skip
            else:
                ip("-n", here.netns, "neigh", "del", there.address, "dev", here.dev, check=False)

    def carrier(self) -> bool:
        """Both ends up with a carrier (LOWER_UP): frames can cross."""
        shown = [ip("-n", n.netns, "link", "show", "dev", n.dev).stdout for n in (self.a, self.b)]
        return all("LOWER_UP" in text.split(">", 1)[0] for text in shown)

    def wait_carrier(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.carrier():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no carrier between {self.a.dev} and {self.b.dev} within {timeout_s:g} s")
            time.sleep(0.02)


def remove_stale() -> None:
    """Delete the namespaces of runs whose process is gone (killed before its ``finally`` ran)."""
    listed = ip("netns", "list", check=False).stdout.split()
    for name in listed:
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            ip("netns", "del", name, check=False)


def refusal() -> str | None:
    """Why two namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no iproute2 (`ip`) on PATH"
    if os.geteuid() != 0:
        return "not root: `ip netns add` needs CAP_SYS_ADMIN"
    return None


@contextlib.contextmanager
def two_nodes(relayed: bool = False) -> Iterator[TwoNodes]:
    """Create the pair for one test (``relayed``: with a namespace between them, whose frames a relay
    must forward); every namespace is deleted on the way out, whatever happens."""
    why = refusal()
    if why:
        raise NetnsUnavailable(why)
    remove_stale()
    tag = f"{random.randrange(0x1000000):06x}"
    third, quad = random.randrange(256), random.randrange(64)
    a = Node(f"{PREFIX}{os.getpid()}-{tag}-a", f"fkva{tag}", f"10.213.{third}.{4 * quad + 1}")
    b = Node(f"{PREFIX}{os.getpid()}-{tag}-b", f"fkvb{tag}", f"10.213.{third}.{4 * quad + 2}")
    between = Between(f"{PREFIX}{os.getpid()}-{tag}-r", f"fkvra{tag}", f"fkvrb{tag}") if relayed else None
    made: list[str] = []
    try:
        for name in (a.netns, b.netns, *([between.netns] if between else [])):
            done = ip("netns", "add", name, check=False)
            if done.returncode != 0:
                raise NetnsUnavailable(f"`ip netns add` refused: {done.stderr.strip()}")
            made.append(name)
        veth = ["ip", "link", "add", a.dev, "netns", a.netns, "type", "veth", "peer", "name"]
        if between is None:
            links = [[*veth, b.dev, "netns", b.netns]]
        else:
            links = [
                [*veth, between.dev_a, "netns", between.netns],
                ["ip", "link", "add", between.dev_b, "netns", between.netns, "type", "veth", "peer", "name", b.dev,
                 "netns", b.netns],
            ]  # fmt: skip
        for argv in (
            *links,
            ["ip", "netns", "exec", a.netns, "true"],  # mounts /sys for the namespace: refused in some containers
        ):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
            if done.returncode != 0:
                raise NetnsUnavailable(f"`{' '.join(argv[:4])} ...` refused: {done.stderr.strip()}")
        for node in (a, b):
            ip("-n", node.netns, "addr", "add", f"{node.address}/30", "dev", node.dev)
            ip("-n", node.netns, "link", "set", "lo", "up")
            ip("-n", node.netns, "link", "set", node.dev, "up")
        if between is not None:
            for dev in (between.dev_a, between.dev_b):
                ip("-n", between.netns, "link", "set", dev, "up")
        nodes = TwoNodes(a, b, between)
        nodes.wait_carrier()
        yield nodes
    finally:
        for name in made:
            ip("netns", "del", name, check=False)
