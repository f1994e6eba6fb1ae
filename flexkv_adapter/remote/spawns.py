"""Which master a remote spawned by FlexKV's ``create_process`` serves, read from its sockets.

The spawn's command line names only temporary pickle files; its kwargs file is never unpickled
(unpickling runs code). What it connects to tells instead: FlexKV's remote connects PULL/PUSH/REP
to the master's three ports, so its TCP peers in ``/proc/<pid>/net/tcp{,6}``, matched to the socket
inodes in ``/proc/<pid>/fd``, name the master. A spawn for this master, or one whose master cannot
be told (no connection yet, or another user's process), is refused; any other is a warning.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import lookup
from .lock import LOOKUP_S, flexkv_spawned_remotes, is_flexkv_spawn

_LISTEN = "0A"


@dataclass(frozen=True)
class Spawn:
    pid: int
    peers: frozenset[tuple[str, int]] | None  # TCP peers (address, port); None when unreadable
    program: str = "python"
    why: str = ""  # set by classify_spawns: why it counts for this master, or which master it serves

    def describe(self) -> str:
        """The process seen and why it counts: the refusal names what an operator must stop."""
        seen = f"pid {self.pid}: {self.program} -c running FlexKV's create_process script (TransferManagerOnRemote)"
        if self.why:
            return f"{seen}, {self.why}"
        if self.peers is None:
            return f"{seen}, its sockets are not readable"
        if not self.peers:
            return f"{seen}, no TCP connection yet"
        return f"{seen}, connected to {_peers(self.peers)}"


def _peers(peers: frozenset[tuple[str, int]] | set[tuple[str, int]]) -> str:
    return ", ".join(f"{h}:{p}" for h, p in sorted(peers))


def _verdict(spawn: Spawn, addresses: set[str], ports: tuple[int, int, int]) -> tuple[bool, str]:
    """(refused, why): a spawn connected to this master, or one whose master its sockets do not tell."""
    if spawn.peers is None:
        return True, "its sockets are not readable (another user's process?), so its master cannot be told"
    if not spawn.peers:
        return True, "no TCP connection yet, so its master cannot be told (FlexKV connects once started)"
    mine = {(h, p) for h, p in spawn.peers if h in addresses and p in ports}
    if mine:
        return True, f"connected to this master's {_peers(mine)}"
    return False, f"connected to {_peers(spawn.peers)}, not to this master"


def _socket_inodes(pid: int) -> set[int] | None:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # another user's process, or gone
        return None
    return inodes


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    v6 = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(v6.ipv4_mapped or v6)


def _tcp_peers(pid: int, inodes: set[int]) -> set[tuple[str, int]]:
    peers = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] == _LISTEN or int(fields[9]) not in inodes:
                continue
            host, _, port = fields[2].partition(":")
            if int(port, 16):
                peers.add((_address(host), int(port, 16)))
    return peers


def spawn_of(pid: int) -> Spawn:
    inodes = _socket_inodes(pid)
    argv = _argv(pid) or ["python"]
    return Spawn(pid, None if inodes is None else frozenset(_tcp_peers(pid, inodes)), argv[0])


def _argv(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None


def _still_a_spawn(pid: int) -> bool:
    """Read again after its sockets: a spawn that exited meanwhile (gone, or a zombie with an empty
    command line and no fds) serves no master, and its unreadable fds must not count as unknown."""
    argv = _argv(pid)
    return argv is not None and is_flexkv_spawn(argv)


def master_addresses(host: str, lookup_s: float = LOOKUP_S) -> set[str]:
    """The master's addresses, looked up within ``lookup_s``: ``lookup.LookupTimedOut`` past it or for
    a transient failure (a spawn of this master would pass as another master's)."""
    try:
        return {str(info[4][0]) for info in lookup.getaddrinfo(host, None, lookup_s)}
    except (OSError, UnicodeError, ValueError) as exc:
        if lookup.transient(exc):
            raise lookup.LookupTimedOut(f"looking up {host!r} failed for now ({exc})") from None
        return {host}


def classify_spawns(
    host: str, ports: tuple[int, int, int], lookup_s: float = LOOKUP_S
) -> tuple[list[Spawn], list[Spawn]]:
    """FlexKV-spawned remotes on this machine: (refused: same or unknown master, others)."""
    addresses = master_addresses(host, lookup_s)
    refused: list[Spawn] = []
    others: list[Spawn] = []
    for spawn in map(spawn_of, flexkv_spawned_remotes()):
        if not _still_a_spawn(spawn.pid):
            continue
        refuse, why = _verdict(spawn, addresses, ports)
        (refused if refuse else others).append(replace(spawn, why=why))
    return refused, others
