"""``remote: external``: wait for ``scripts/start_remote.py`` instead of letting FlexKV spawn a remote.

FlexKV's connectors call ``TransferManagerOnRemote.create_process(master_host=, master_ports=)`` on
local rank 0 of every node but node 0, and spawn an unsupervised remote transfer process. When
start_remote already runs that remote, a second one would split the master's commands. The
engine-side call is therefore replaced by :func:`wait_for_start_remote`: it blocks, with a
deadline, until start_remote reports that the remote waits for this node's GPU registrations
(or is ready), and returns an :class:`ExternalRemote` handle that owns nothing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import AdapterError
from ..settings import AdapterSettings

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # start_remote's answers are small JSON; never read a stream or a device to its end
# start_remote's states once the master's config arrived (registration may proceed), and its dead ends.
PROCEED_STATES = frozenset({"waiting_for_gpus", "starting_engine", "ready"})
FAILED_STATES = frozenset({"failed", "shutting_down"})
HINT = (
    "Start it on this node before the engine: python scripts/start_remote.py --config <the same YAML> "
    "(or set remote: engine to let FlexKV spawn its own remote)"
)


class ExternalRemoteError(AdapterError):
    """start_remote did not answer, failed, or did not reach waiting_for_gpus/ready in time."""


@dataclass(frozen=True)
class Probe:
    """One look at start_remote: its state, or None when nothing answered, and what was seen."""

    state: str | None
    seen: str
    master: str | None = None


class ExternalRemote:
    """Stands where FlexKV's spawned process would be; start_remote owns the remote, so stopping is a no-op.

    Both SGLang connectors' ``shutdown()`` call ``terminate()``, ``join(timeout)``, ``is_alive()`` and
    ``kill()`` on it.
    """

    pid: int | None = None
    returncode: int | None = None

    def __init__(self, source: str) -> None:
        self.source = source

    def terminate(self) -> None:
        logger.info("remote: external: start_remote (%s) keeps running; stop it with its own service", self.source)

    def kill(self) -> None:
        """Nothing to kill: this process never started the remote."""

    def join(self, timeout: float | None = None) -> None:
        """Returns at once: there is no child to wait for."""

    def is_alive(self) -> bool:
        return False

    def close(self) -> None:
        """Nothing to close."""

    def __repr__(self) -> str:
        return f"<ExternalRemote via {self.source}>"


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# The endpoint is on this node: never through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe_health(host: str, port: int, timeout_s: float) -> Probe:
    """GET start_remote's health endpoint; it answers 503 with the same JSON body until ready."""
    url = f"http://{_client_host(host)}:{port}/"
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            body = response.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_BODY)
    except (urllib.error.URLError, OSError) as exc:
        return Probe(None, f"no answer on {url} ({getattr(exc, 'reason', exc)})")
    return _parse(body, url)


def probe_ready_file(path: Path) -> Probe:
    """start_remote writes the ready file (JSON) only while ready; a file whose pid is gone is stale."""
    try:
        body = _read_regular_file(path)
    except OSError as exc:
        return Probe(None, f"no ready file {path} ({exc.strerror or exc})")
    probe = _parse(body, str(path))
    pid = _pid_of(body)
    if probe.state is not None and pid is not None and not _alive(pid):
        return Probe(None, f"stale ready file {path} (pid {pid} is gone)")
    return probe


def _read_regular_file(path: Path) -> bytes:
    """At most MAX_BODY bytes of a regular file; a FIFO or device is refused without blocking on it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read(MAX_BODY)
    finally:
        os.close(fd)


def _parse(body: bytes, where: str) -> Probe:
    try:
        data: Any = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        return Probe(None, f"{where} answered without a JSON state: {body[:120]!r}")
    detail = f" ({data['detail']})" if data.get("detail") else ""
    master = data.get("master") if isinstance(data.get("master"), str) else None
    return Probe(data["state"], f"{where}: state {data['state']}{detail}", master)


def _pid_of(body: bytes) -> int | None:
    try:
        pid = json.loads(body).get("pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_start_remote(
    settings: AdapterSettings,
    master_host: str,
    master_ports: Any,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.5,
) -> ExternalRemote:
    """Block until start_remote on this node reaches waiting_for_gpus/ready, or raise with what was seen."""
    if settings.health_port is None and settings.ready_file is None:
        raise ExternalRemoteError(
            "remote: external needs start_remote's health_port in the settings (the same value "
            f"scripts/start_remote.py uses) to know when its remote waits for this node's GPUs. {HINT}"
        )
    expected = f"{master_host}:{_first_port(master_ports)}"
    if settings.health_port is None and settings.ready_file is not None:
        return _from_ready_file(settings.ready_file, expected)
    start = clock()
    answered = False
    last = Probe(None, "not probed yet")
    logger.info("remote: external: waiting for start_remote (master %s) instead of spawning a remote", expected)
    while True:
        probes = []
        if settings.health_port is not None:
            probes.append(probe_health(settings.health_host, settings.health_port, timeout_s=min(2.0, poll_s * 4)))
        if settings.ready_file is not None:
            probes.append(probe_ready_file(settings.ready_file))
        last = next((p for p in probes if p.state is not None), probes[0])
        if last.state is not None:
            answered = True
            _check_master(last, expected)
            if last.state in PROCEED_STATES:
                logger.info("remote: external: start_remote is up (%s); nothing spawned", last.seen)
                return ExternalRemote(last.seen)
            if last.state in FAILED_STATES:
                raise ExternalRemoteError(f"start_remote on this node reports {last.seen}; see its log. {HINT}")
        waited = clock() - start
        if not answered and waited >= settings.remote_absent_s:
            raise ExternalRemoteError(
                f"remote: external, but scripts/start_remote.py is not running on this node: nothing answered "
                f"within remote_absent_s={settings.remote_absent_s:g} s (last: {last.seen}). {HINT}"
            )
        if waited >= settings.remote_wait_s:
            raise ExternalRemoteError(
                f"start_remote did not reach waiting_for_gpus or ready within remote_wait_s="
                f"{settings.remote_wait_s:g} s (last: {last.seen}); is node 0 (master {expected}) up?"
            )
        sleep(poll_s)


def _from_ready_file(path: Path, expected: str) -> ExternalRemote:
    """Without the health endpoint only a remote that is ready already can be seen; waiting would deadlock."""
    probe = probe_ready_file(path)
    if probe.state in PROCEED_STATES:
        _check_master(probe, expected)
        logger.info("remote: external: start_remote is up (%s); nothing spawned", probe.seen)
        return ExternalRemote(probe.seen)
    raise ExternalRemoteError(
        f"remote: external with only ready_file set, and start_remote is not ready ({probe.seen}). Its ready file "
        f"appears only after every GPU of this node registered, which happens after this point: set health_port "
        f"(the same as start_remote's) so the engine can see waiting_for_gpus. {HINT}"
    )


def _first_port(ports: Any) -> str:
    try:
        return str(ports[0]).strip()
    except (TypeError, IndexError, KeyError):
        return str(ports)


def _check_master(probe: Probe, expected: str) -> None:
    """start_remote must serve the master this engine registers with, or the registration goes nowhere."""
    if probe.master is None:
        return
    host, _, port = probe.master.rpartition(":")
    want_host, _, want_port = expected.rpartition(":")
    if port != want_port or not _same_host(host, want_host):
        raise ExternalRemoteError(
            f"start_remote serves master {probe.master} but the engine's FlexKV uses {expected} (its host from "
            f"--dist-init-addr, its ports from FLEXKV_MASTER_PORTS); give both the same master"
        )


@lru_cache(maxsize=16)
def _addresses(host: str) -> frozenset[str]:
    """Resolved once per name: the master is compared on every poll."""
    try:
        return frozenset(str(info[4][0]) for info in socket.getaddrinfo(host, None))
    except (OSError, UnicodeError):
        return frozenset()


def _same_host(a: str, b: str) -> bool:
    """Equal names, or names resolving to a common address; unresolvable names are not judged."""
    if a == b:
        return True
    found_a, found_b = _addresses(a), _addresses(b)
    return not found_a or not found_b or bool(found_a & found_b)


__all__ = [
    "ExternalRemote",
    "ExternalRemoteError",
    "Probe",
    "probe_health",
    "probe_ready_file",
    "wait_for_start_remote",
]
