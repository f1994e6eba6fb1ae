"""Checks before the remote starts: settings that must be refused, GPU visibility, the master's ports."""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable

from ..config import lookup
from ..config.hosts import classify_host, ipv4_address
from ..config.settings import AdapterSettings
from ..errors import FLEXKV_INSTALL_HINT
from .exit_codes import ExitCode, RemoteExit

logger = logging.getLogger(__name__)


class StopRequested(Exception):
    """A stop signal arrived before the transfer manager connected to the master."""


def validate(s: AdapterSettings) -> None:
    """Refuse settings a remote must not run with (each with its own exit status)."""
    if not s.master_host:  # the required settings first, in the order --help lists them
        raise RemoteExit(
            ExitCode.SETTINGS, "master_host is unset: set FLEXKV_MASTER_HOST (or --master-host) to node 0's address"
        )
    if "node_rank" not in s.model_fields_set:  # its default (0) is the engine's, never a remote's
        raise RemoteExit(
            ExitCode.SETTINGS,
            "node_rank is unset: give this node's rank, 1..nnodes-1 (--node-rank or FLEXKV_ADAPTER_NODE_RANK)",
        )
    if s.node_rank == 0:
        raise RemoteExit(
            ExitCode.NODE_RANK_ZERO,
            "node_rank is 0: node 0 runs FlexKV's master; run start_remote on nodes 1..nnodes-1",
        )
    if _ipv6_literal(s.master_host):
        raise RemoteExit(
            ExitCode.SETTINGS,
            f"master_host {s.master_host} is an IPv6 address: FlexKV's ZMQ sockets never enable IPv6 "
            f"(tcp://host:port without zmq.IPV6), so neither node 0's master nor this remote could use it; "
            f"set node 0's IPv4 address or a name that resolves to it",
        )
    kind = _master_kind(s)
    if kind == "unresolved":
        raise RemoteExit(ExitCode.SETTINGS, f"master_host {s.master_host!r} does not resolve")
    if kind == "unspecified":  # a name resolving to 0.0.0.0 (blocklist /etc/hosts); literals fail at load
        raise RemoteExit(
            ExitCode.SETTINGS,
            f"master_host {s.master_host!r} resolves to a wildcard address (0.0.0.0), not node 0's address",
        )
    if kind == "loopback" and s.nnodes > 1 and not s.allow_loopback_master:
        raise RemoteExit(
            ExitCode.LOOPBACK_MASTER,
            f"master_host {s.master_host} is a loopback address but nnodes={s.nnodes}: other nodes "
            f"cannot reach it (set allow_loopback_master only to test on one machine)",
        )
    if kind == "public":
        logger.warning(
            "master_host %s is a public address: FlexKV unpickles whatever arrives on ports %s; "
            "keep them on a trusted network",
            s.master_host,
            s.master_ports,
        )


def unresolved_master(s: AdapterSettings, exc: lookup.LookupTimedOut) -> RemoteExit:
    """A resolver that does not answer is not a wrong setting: exit 10, as a master that does not answer."""
    return RemoteExit(
        ExitCode.MASTER_UNREACHABLE,
        f"master_host {s.master_host!r} did not resolve within connect_timeout_s={s.connect_timeout_s:g} s "
        f"({exc}); fix this node's resolver or give node 0's IP address",
    )


def _master_kind(s: AdapterSettings) -> str:
    assert s.master_host is not None
    try:
        return classify_host(s.master_host, s.connect_timeout_s)
    except lookup.LookupTimedOut as exc:
        raise unresolved_master(s, exc) from None


def _ipv6_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip().strip("[]").split("%", 1)[0]).version == 6
    except ValueError:
        return False


def apply_gpu_visibility(keep: bool, apply: bool = True) -> str:
    """Clear CUDA_VISIBLE_DEVICES as FlexKV's own spawn does (its remote expects physical ids);
    ``apply=False`` (--dry-run) only says what would be done."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if keep:
        decision = f"kept CUDA_VISIBLE_DEVICES={value!r} (keep_cuda_visible_devices)"
    elif value is None:
        decision = "CUDA_VISIBLE_DEVICES unset: the remote sees every GPU (physical device ids)"
    else:
        if apply:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        verb = "cleared" if apply else "would clear"
        decision = f"{verb} CUDA_VISIBLE_DEVICES={value!r}: FlexKV's remote expects physical device ids"
    logger.info("%s", decision)
    return decision


def load_transfer_manager(spec: str) -> type:
    """Import ``module:Class`` (default: FlexKV's ``TransferManagerOnRemote``) and check that it
    looks like one: a class built from ``master_host``/``master_ports`` with a ``start()``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RemoteExit(ExitCode.SETTINGS, f"transfer_manager must be 'module:Class', got {spec!r}")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
        importlib.import_module("zmq")  # FlexKV's dependency; the master watch uses it too
    except Exception as exc:  # an import can raise anything (a CUDA probe, a bad extension build)
        hint = FLEXKV_INSTALL_HINT if module_name.startswith("flexkv") else "check transfer_manager"
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise RemoteExit(ExitCode.FLEXKV_MISSING, f"cannot import {spec} ({why}). {hint}") from None
    if not isinstance(cls, type):
        raise RemoteExit(ExitCode.SETTINGS, f"{spec} is not a class")
    missing = _not_a_transfer_manager(cls)
    if missing:
        raise RemoteExit(
            ExitCode.SETTINGS,
            f"{spec} is not a remote transfer manager ({missing}); transfer_manager names a class like "
            f"FlexKV's flexkv.transfer_manager:TransferManagerOnRemote",
        )
    return cls


def _not_a_transfer_manager(cls: type) -> str:
    """What ``cls`` lacks of FlexKV's TransferManagerOnRemote interface ('' if nothing)."""
    if not callable(getattr(cls, "start", None)):
        return "no start() method"
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a C class without a signature: not judged
        return ""
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    lacking = [name for name in ("master_host", "master_ports") if name not in params and not takes_any]
    return f"its constructor takes no {' or '.join(lacking)}" if lacking else ""


def unreachable_ports(
    host: str, ports: tuple[int, ...], timeout: float | None = None, within_s: float | None = None
) -> dict[int, str]:
    """Ports of ``host`` that do not accept a TCP connection, with the reason. The name is looked up
    once (``create_connection`` would look it up per port, with no bound). Each step waits at most
    ``timeout`` (None: no bound of its own) and, with ``within_s``, the whole call at most ``within_s``: a
    port there is no time left for is reported untried."""
    end = time.monotonic() + (within_s if within_s is not None else float("inf"))
    cap = timeout if timeout is not None else float("inf")

    def left() -> float:
        return min(cap, end - time.monotonic())

    try:
        address = ipv4_address(host, max(0.0, left()))
    except lookup.LookupTimedOut as exc:
        return dict.fromkeys(ports, str(exc))
    if address is None:
        return dict.fromkeys(ports, f"{host} has no IPv4 address now")
    failed = {}
    for port in ports:
        budget = left()
        if budget <= 0:
            failed[port] = "not tried: no time left"
            continue
        try:
            with socket.create_connection((address, port), timeout=budget):
                pass
        except OSError as exc:
            failed[port] = exc.strerror or type(exc).__name__
    return failed


def wait_for_master(s: AdapterSettings, should_stop: Callable[[float], bool]) -> None:
    """Wait, with exponential backoff, until the master's three ports accept TCP connections.

    ZMQ connects never fail, so without this a wrong address would just hang. ``should_stop``
    sleeps up to the given seconds and returns True if a signal asked us to stop. Each port's connect
    and the name lookup get what is left of ``connect_timeout_s``, no less and no more: a link whose round
    trip is longer than any fixed cap still connects (the kernel retransmits a lost SYN within the same
    connect), and a master that silently drops packets ends in exit 10 on time, not a poll later.
    """
    assert s.master_host is not None
    start, delay = time.monotonic(), 0.1
    deadline = start + s.connect_timeout_s
    if should_stop(0):
        raise StopRequested
    while True:
        left = deadline - time.monotonic()
        failed = unreachable_ports(s.master_host, s.master_ports, within_s=max(0.0, left))
        if not failed:
            logger.info("master %s ports %s accept connections", s.master_host, s.master_ports)
            return
        why = ", ".join(f"{p}: {r}" for p, r in failed.items())
        now = time.monotonic()  # after the poll, which can take what was left
        remaining = deadline - now
        if remaining <= 0:
            raise RemoteExit(
                ExitCode.MASTER_UNREACHABLE,
                f"master {s.master_host} ports {s.master_ports} not reachable within "
                f"{s.connect_timeout_s:g}s ({why}); is node 0's engine up with FlexKV multi-node on?",
            )
        wait = min(delay, remaining)
        logger.info(
            "waiting for master %s (%s); retry in %.1fs (%.1fs of %gs)",
            s.master_host,
            why,
            wait,
            now - start,
            s.connect_timeout_s,
        )
        if should_stop(wait):
            raise StopRequested
        delay = min(delay * 2, 5.0)
