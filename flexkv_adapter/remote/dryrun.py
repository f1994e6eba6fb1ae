"""``--dry-run``: validate and print the plan, changing nothing.

It validates the settings and paths (the same refusals, the same exit statuses as a real start),
looks at the lock, the ready file, the health port and FlexKV-spawned remotes without taking,
binding, writing or deleting anything, and reports a missing FlexKV, an unreachable master, a
held lock, a port in use and a spawned remote as warning lines. It exits with the status a real start
would give now: 0 when it would start, else the first refusal's (5, 6, 8, 9, in the order a real
start meets them). A master that does not answer yet is only a warning: a real start waits
``connect_timeout_s`` for it.
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


def _warnings(s: AdapterSettings, lock: InstanceLock, ready_file: ReadyFile | None) -> list[tuple[ExitCode, str]]:
    """What a real start would meet, in its order: each with the status it would end with (OK: only a warning)."""
    assert s.master_host is not None
    found: list[tuple[ExitCode, str]] = []

    def refuse(code: ExitCode, text: str) -> None:
        found.append((code, f"a real start would exit {int(code)}: {text}"))

    try:
        load_transfer_manager(s.transfer_manager)
    except RemoteExit as exc:
        if exc.code is not ExitCode.FLEXKV_MISSING:
            raise  # an importable class that is not a transfer manager is a settings error
        hint = "" if FLEXKV_INSTALL_HINT in str(exc) else f" {FLEXKV_INSTALL_HINT}"
        refuse(ExitCode.FLEXKV_MISSING, f"{exc}{hint}")
    holder = lock.holder()
    if holder is not None:
        refuse(ExitCode.ALREADY_RUNNING, f"start_remote pid {holder} holds the lock of this master")
    refused, others = classify_spawns(s.master_host, s.master_ports, s.connect_timeout_s)
    for spawn in refused:
        refuse(ExitCode.ALREADY_RUNNING, f"FlexKV's engine spawned a remote, {spawn.describe()}")
    for spawn in others:
        found.append((ExitCode.OK, f"FlexKV's engine spawned a remote for another master, {spawn.describe()}"))
    if ready_file is not None and (pid := ready_file.in_use_by()) is not None:
        refuse(ExitCode.LOCAL_FILES, f"ready_file {ready_file.path} belongs to running pid {pid}")
    try:
        if s.health_port and _in_use(s.health_host, s.health_port, s.connect_timeout_s):
            refuse(ExitCode.HEALTH_ENDPOINT, f"{s.health_host}:{s.health_port} already accepts connections")
    except lookup.LookupTimedOut as exc:
        refuse(ExitCode.HEALTH_ENDPOINT, f"health_host {s.health_host}: {exc}")
    failed = unreachable_ports(s.master_host, s.master_ports, within_s=s.connect_timeout_s)
    if failed:
        why = ", ".join(f"{p}: {r}" for p, r in failed.items())
        text = f"master {s.master_host} ports not reachable now ({why}); a real start waits connect_timeout_s"
        found.append((ExitCode.OK, text))
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
    """Validate paths, look around, print the plan with its warnings; return the status a real start would
    end with now (OK when it would start; the first refusal's otherwise)."""
    assert s.master_host is not None
    sys.dont_write_bytecode = True  # importing the transfer manager from a writable tree writes no __pycache__
    lock_dir = prepare_lock_dir(s.lock_dir, create=False)
    ready_file = ReadyFile(s.ready_file) if s.ready_file else None
    if ready_file is not None:
        ready_file.check()
    visibility = apply_gpu_visibility(s.keep_cuda_visible_devices, apply=False)
    lock = InstanceLock(lock_dir, s.master_host, s.master_ports, s.connect_timeout_s)
    found = _warnings(s, lock, ready_file)
    for _, warning in found:
        logger.warning("dry run: %s", warning)
    code, first = next(((c, w) for c, w in found if c is not ExitCode.OK), (ExitCode.OK, ""))
    warnings = [w for _, w in found]
    report: dict[str, Any] = {
        **plan(s, visibility, lock),
        "dry_run": True,
        "warnings": warnings,
        "exit_status": int(code),
    }
    say(json.dumps(report, indent=2))
    if code is ExitCode.OK:
        logger.info("dry run: settings valid, nothing changed (%d warning(s))", len(warnings))
    else:  # the last line, as a real start's failure ends
        logger.error("dry run: %s (nothing changed)", first)
    return code
