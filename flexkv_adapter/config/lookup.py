"""Name lookups that end by a deadline: ``getaddrinfo`` has no timeout of its own.

A resolver that does not answer (a dead DNS server, an unreachable search domain) would hold the
engine past ``remote_wait_s`` (a lookup of ``health_host`` or of the master's name), start_remote past
``connect_timeout_s`` and ``flexkv-adapter doctor`` for ever. Here the
lookup runs in a daemon thread and the caller waits at most its budget. One lookup per name and
port is in flight at a time: a resolver that never answers costs one thread per name, not one per
poll, and at most ``MAX_IN_FLIGHT`` threads in all; a late answer serves whoever waits on it then. IP
literals never reach the resolver.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

MAX_IN_FLIGHT = 32  # names looked up at once; some come from start_remote's answers, not from settings
AddrInfo = tuple[Any, ...]  # (family, type, proto, canonname, sockaddr), as socket.getaddrinfo returns


class LookupTimedOut(Exception):
    """The resolver did not answer within the budget (the lookup goes on in its thread)."""


_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def transient(exc: BaseException) -> bool:
    """Whether a failed lookup may succeed if asked again: the resolver's own failures (EAI_AGAIN, a
    server that failed, no network yet), not an answer that the name does not exist or cannot be a name."""
    if isinstance(exc, socket.gaierror):
        return exc.errno not in _NO_SUCH_NAME
    return isinstance(exc, OSError)


class _Lookup:
    def __init__(self, host: str, port: int | None) -> None:
        self.host, self.port = host, port
        self.done = threading.Event()
        self.found: list[AddrInfo] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.found = list(socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to every waiter: gaierror, a bad name, anything
            self.error = exc
        finally:
            with _lock:
                if _pending.get((self.host, self.port)) is self:
                    del _pending[(self.host, self.port)]
            self.done.set()


_lock = threading.Lock()
_pending: dict[tuple[str, int | None], _Lookup] = {}


def _numeric(host: str, port: int | None) -> list[AddrInfo] | None:
    try:
        return list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST))
    except (OSError, UnicodeError, ValueError):
        return None


def getaddrinfo(host: str, port: int | None, timeout_s: float) -> list[AddrInfo]:
    """``socket.getaddrinfo(host, port, type=SOCK_STREAM)`` within ``timeout_s``, or :class:`LookupTimedOut`.

    The resolver's own errors (``socket.gaierror``, ``UnicodeError`` for a bad name) pass through."""
    found = _numeric(host, port)
    if found is not None:
        return found
    with _lock:
        lookup = _pending.get((host, port))
        if lookup is None:
            if len(_pending) >= MAX_IN_FLIGHT:  # a resolver that answers none: no thread per further name
                raise LookupTimedOut(f"looking up {host!r}: {len(_pending)} lookups already wait on the resolver")
            lookup = _Lookup(host, port)
            try:
                threading.Thread(target=lookup.run, name=f"lookup {host[:40]}", daemon=True).start()
            except RuntimeError as exc:  # out of threads: nothing is left pending for this name
                raise LookupTimedOut(f"looking up {host!r}: no thread to run it ({exc})") from None
            _pending[(host, port)] = lookup
    if not lookup.done.wait(max(0.0, timeout_s)):
        raise LookupTimedOut(f"looking up {host!r} timed out: the resolver did not answer within {timeout_s:.3g} s")
    if lookup.error is not None:
        raise lookup.error
    return lookup.found


__all__ = ["MAX_IN_FLIGHT", "AddrInfo", "LookupTimedOut", "getaddrinfo", "transient"]
