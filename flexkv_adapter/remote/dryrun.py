"""``--dry-run``: validate and print the plan, changing nothing.

It validates the settings and paths (the same refusals, the same exit statuses as a real start),
looks at the lock, the ready file, the health port and FlexKV-spawned remotes without taking,
binding, writing or deleting anything, and reports a missing FlexKV, an unreachable master, a
held lock, a port in use and a spawned remote as warnings. Valid settings exit 0.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from typing import Any

from ..config import lookup
from ..config.settings import AdapterSettings
from ..errors import FLEXKV_INSTALL_HINT
from .exit_codes import ExitCode, RemoteExit
from .lock import InstanceLock, prepare_lock_dir
from .output import say
from .preflight import apply_gpu_visibility, load_transfer_manager, unreachable_ports
from .spawns import classify_spawns
from .states import ReadyFile

logger = logging.getLogger("flexkv_adapter.remote")


def _in_use(host: str, port: int, lookup_s: float) -> bool:
    """Something accepts on ``host:port`` (checked by connecting, never by binding); the name is looked
    up within ``lookup_s`` (``lookup.LookupTimedOut``)."""
    target = host if host not in ("0.0.0.0", "", "::") else "127.0.0.1"
    try:
        family, kind, proto, _, sockaddr = lookup.getaddrinfo(target, port, lookup_s)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(0.5)
            sock.connect(sockaddr)
            return True
    except (OSError, UnicodeError, ValueError):
        return False


def _warnings(s: AdapterSettings, lock: InstanceLock, ready_file: ReadyFile | None) -> list[str]:
    assert s.master_host is not None
    found = []
    try:
        load_transfer_manager(s.transfer_manager)
    except RemoteExit as exc:
        if exc.code is not ExitCode.FLEXKV_MISSING:
            raise  # an importable class that is not a transfer manager is a settings error
        hint = "" if FLEXKV_INSTALL_HINT in str(exc) else f" {FLEXKV_INSTALL_HINT}"
        found.append(f"a real start would exit 5: {exc}{hint}")
    holder = lock.holder()
    if holder is not None:
        found.append(f"a real start would exit 6: start_remote pid {holder} holds the lock of this master")
    refused, others = classify_spawns(s.master_host, s.master_ports, s.connect_timeout_s)
    for spawn in refused:
        found.append(f"a real start would exit 6: FlexKV's engine spawned a remote, {spawn.describe()}")
    for spawn in others:
        found.append(f"FlexKV's engine spawned a remote for another master, {spawn.describe()}")
    if ready_file is not None and (pid := ready_file.in_use_by()) is not None:
        found.append(f"a real start would exit 8: ready_file {ready_file.path} belongs to running pid {pid}")
    try:
        if s.health_port and _in_use(s.health_host, s.health_port, s.connect_timeout_s):
            found.append(f"a real start would exit 9: {s.health_host}:{s.health_port} already accepts connections")
    except lookup.LookupTimedOut as exc:
        found.append(f"a real start would exit 9: health_host {s.health_host}: {exc}")
    failed = unreachable_ports(s.master_host, s.master_ports, within_s=s.connect_timeout_s)
    if failed:
        why = ", ".join(f"{p}: {r}" for p, r in failed.items())
        found.append(f"master {s.master_host} ports not reachable now ({why}); a real start waits connect_timeout_s")
    return found


def plan(s: AdapterSettings, visibility: str, lock: InstanceLock) -> dict[str, Any]:
    """What a real start would do, resolved from the settings."""
    return {
        "master": {"host": s.master_host, "ports": list(s.master_ports)},
        "node_rank": s.node_rank,
        "nnodes": s.nnodes,
        "transfer_manager": s.transfer_manager,
        "gpu_register_port": f"{s.server_recv_port}_gpu_register",
        "gpu_visibility": visibility,
        "deadlines_s": {
            "connect": s.connect_timeout_s,
            "handshake": s.handshake_timeout_s,
            "gpu_registration": s.gpu_timeout_s,
            "engine_start": s.engine_timeout_s,
            "grace": s.grace_s,
            "reap_grace": s.reap_grace_s,
            "probe_interval": s.probe_interval_s,
            "master_lost": s.master_lost_s,
        },
        "health": f"http://{s.health_host}:{s.health_port}/" if s.health_port else None,
        "ready_file": str(s.ready_file) if s.ready_file else None,
        "lock": str(lock.path),
    }


def dry_run(s: AdapterSettings) -> ExitCode:
    """Validate paths, look around, print the plan with its warnings; exit 0 unless the settings are invalid."""
    assert s.master_host is not None
    sys.dont_write_bytecode = True  # importing the transfer manager from a writable tree writes no __pycache__
    lock_dir = prepare_lock_dir(s.lock_dir, create=False)
    ready_file = ReadyFile(s.ready_file) if s.ready_file else None
    if ready_file is not None:
        ready_file.check()
    visibility = apply_gpu_visibility(s.keep_cuda_visible_devices, apply=False)
    lock = InstanceLock(lock_dir, s.master_host, s.master_ports, s.connect_timeout_s)
    warnings = _warnings(s, lock, ready_file)
    for warning in warnings:
        logger.warning("dry run: %s", warning)
    report: dict[str, Any] = {**plan(s, visibility, lock), "dry_run": True, "warnings": warnings}
    say(json.dumps(report, indent=2))
    logger.info("dry run: settings valid, nothing changed (%d warning(s))", len(warnings))
    return ExitCode.OK
