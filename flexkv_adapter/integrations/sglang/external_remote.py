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
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...config import lookup
from ...config.pids import alive
from ...config.settings import AdapterSettings
from ...errors import AdapterError
from ...text import clip
from . import health_probe

logger = logging.getLogger(__name__)

MAX_BODY = health_probe.MAX_BODY  # small JSON; never read a stream or a device to its end
PROBE_S = 2.0  # one probe at most, so a slow port is retried rather than waited on
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
    pid: int | None = None


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


def probe_health(host: str, port: int, timeout_s: float) -> Probe:
    """GET start_remote's health endpoint within ``timeout_s`` in all; it answers 503 with the same
    JSON body until ready. Whatever else answers (or nothing) is a Probe without a state."""
    where = f"http://{host}:{port}/"
    try:
        _, body = health_probe.get(host, port, timeout_s)
    except health_probe.ProbeFailed as exc:
        return Probe(None, f"no answer from start_remote on {where} ({exc})")
    return _parse(body, where)


def probe_ready_file(path: Path) -> Probe:
    """start_remote writes the ready file (JSON) only while ready; a file whose pid is gone is stale."""
    try:
        body = _read_regular_file(path)
    except OSError as exc:
        return Probe(None, f"no ready file {path} ({exc.strerror or exc})")
    probe = _parse(body, str(path))
    pid = _pid_of(body)
    if probe.state is not None and pid is not None and not alive(pid):
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


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to be start_remote's
        return None


def _parse(body: bytes, where: str) -> Probe:
    data = _json(body)
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        return Probe(None, f"{where} answered without a JSON state: {body[:120]!r}")
    detail = f" ({clip(str(data['detail']), 300)})" if data.get("detail") else ""
    master = data.get("master") if isinstance(data.get("master"), str) else None
    return Probe(data["state"], f"{where}: state {clip(data['state'], 60)}{detail}", master, _pid_of(body))


def _pid_of(body: bytes) -> int | None:
    data = _json(body)
    pid = data.get("pid") if isinstance(data, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


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
        return _from_ready_file(settings.ready_file, expected, settings.remote_wait_s)
    start = clock()
    answered: Probe | None = None  # the last answer with a state, and when it came
    answered_at = start
    last = Probe(None, "not probed yet")
    logger.info("remote: external: waiting for start_remote (master %s) instead of spawning a remote", expected)
    while True:
        # every probe ends by the nearest deadline, however slowly the port answers
        deadline = min(start + settings.remote_wait_s, answered_at + settings.remote_absent_s)
        budget = max(0.001, min(PROBE_S, deadline - clock()))
        probes = []
        if settings.health_port is not None:
            probes.append(probe_health(settings.health_host, settings.health_port, timeout_s=budget))
        if settings.ready_file is not None:
            probes.append(probe_ready_file(settings.ready_file))
        seen = next((p for p in probes if p.state is not None), probes[0])
        cut_short = seen.state is None and budget < PROBE_S and "timed out" in seen.seen
        last = last if cut_short and last.seen != "not probed yet" else seen  # keep what was seen before
        now = clock()
        if seen.state is not None:  # only a fresh answer counts: a kept one would restart remote_absent_s
            # a pid this process cannot see (another pid namespace) proves nothing later
            answered, answered_at = (last if last.pid is None or alive(last.pid) else replace(last, pid=None)), now
            _check_master(last, expected, min(start + settings.remote_wait_s, now + settings.remote_absent_s) - now)
            if last.state in PROCEED_STATES:
                logger.info("remote: external: start_remote is up (%s); nothing spawned", last.seen)
                return ExternalRemote(last.seen)
            if last.state in FAILED_STATES:
                raise ExternalRemoteError(f"start_remote on this node reports {last.seen}; see its log. {HINT}")
        elif answered is not None:
            _check_gone(answered, seen, now - answered_at, settings.remote_absent_s)
        elif now - start >= settings.remote_absent_s:
            raise ExternalRemoteError(
                f"remote: external, but scripts/start_remote.py is not running on this node: nothing answered "
                f"within remote_absent_s={settings.remote_absent_s:g} s (last: {last.seen}). {HINT}"
            )
        if now - start >= settings.remote_wait_s:
            raise ExternalRemoteError(
                f"start_remote did not reach waiting_for_gpus or ready within remote_wait_s="
                f"{settings.remote_wait_s:g} s (last: {last.seen}); is node 0 (master {expected}) up?"
            )
        nearest = min(start + settings.remote_wait_s, answered_at + settings.remote_absent_s)
        sleep(max(0.0, min(poll_s, nearest - now)))  # give up at the deadline, not at the next poll


def _check_gone(answered: Probe, last: Probe, silent_s: float, absent_s: float) -> None:
    """start_remote answered before and answers no more: its process ended, or it has been silent too long."""
    gone = answered.pid is not None and not alive(answered.pid)
    if gone or silent_s >= absent_s:
        why = f"its process (pid {answered.pid}) ended" if gone else f"silent for remote_absent_s={absent_s:g} s"
        raise ExternalRemoteError(
            f"start_remote went away after answering ({why}); it last reported {answered.seen}, now {last.seen}. "
            f"See its log and restart it (it exits when it fails; a service manager restarts it). {HINT}"
        )


def _from_ready_file(path: Path, expected: str, budget_s: float) -> ExternalRemote:
    """Without the health endpoint only a remote that is ready already can be seen; waiting would deadlock."""
    probe = probe_ready_file(path)
    if probe.state in PROCEED_STATES:
        _check_master(probe, expected, budget_s)
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


def _check_master(probe: Probe, expected: str, budget_s: float) -> None:
    """start_remote must serve the master this engine registers with, or the registration goes nowhere.
    Names are looked up within ``budget_s`` (what is left of the engine's deadline)."""
    if probe.master is None:
        return
    host, _, port = probe.master.rpartition(":")
    want_host, _, want_port = expected.rpartition(":")
    try:
        same = port == want_port and _same_host(host, want_host, budget_s)
    except lookup.LookupTimedOut as exc:
        raise ExternalRemoteError(
            f"start_remote answered ({probe.seen}), but whether its master {probe.master} is the engine's "
            f"{expected} cannot be told: {exc}, before the engine's deadline (remote_wait_s/remote_absent_s). "
            f"Give the master as an IP address, or fix this node's resolver"
        ) from None
    if not same:
        raise ExternalRemoteError(
            f"start_remote serves master {probe.master} but the engine's FlexKV uses {expected} (its host from "
            f"--dist-init-addr, its ports from FLEXKV_MASTER_PORTS); give both the same master"
        )


_resolved: dict[str, frozenset[str]] = {}  # once per name: the master is compared on every poll


def _addresses(host: str, budget_s: float) -> frozenset[str]:
    """The name's addresses (none for a name that does not resolve); :class:`lookup.LookupTimedOut`
    when the resolver does not answer within ``budget_s``. Neither that nor a transient failure
    (EAI_AGAIN) is remembered: the next poll asks again, so a resolver that recovers is heard."""
    if host not in _resolved:
        try:
            found = frozenset(str(info[4][0]) for info in lookup.getaddrinfo(host, None, budget_s))
        except (OSError, UnicodeError, ValueError) as exc:
            if lookup.transient(exc):
                return frozenset()  # not judged on this poll
            found = frozenset()
        if len(_resolved) >= 16:
            _resolved.clear()
        _resolved[host] = found
    return _resolved[host]


def _same_host(a: str, b: str, budget_s: float) -> bool:
    """Equal names, or names resolving to a common address; unresolvable names are not judged."""
    if a == b:
        return True
    found_a, found_b = _addresses(a, budget_s), _addresses(b, budget_s)
    return not found_a or not found_b or bool(found_a & found_b)


__all__ = [
    "ExternalRemote",
    "ExternalRemoteError",
    "Probe",
    "probe_health",
    "probe_ready_file",
    "wait_for_start_remote",
]
