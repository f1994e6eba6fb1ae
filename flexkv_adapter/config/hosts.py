"""Classify a master address: loopback, private, public, unspecified or unresolved (system resolver,
within a bound: see :mod:`flexkv_adapter.config.lookup`)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Literal

from . import lookup

HostKind = Literal["loopback", "private", "public", "unspecified", "unresolved"]


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP literal (also ``[::]`` and inet_aton's short forms such as ``0``), else None."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


def is_unspecified(host: str) -> bool:
    """Whether ``host`` is a wildcard address (``0.0.0.0``, ``::``): one to bind to, never to connect to."""
    address = _literal(host)
    return address is not None and address.is_unspecified


def ipv4_address(host: str, timeout_s: float) -> str | None:
    """``host``'s first IPv4 address (what ``gethostbyname`` and FlexKV's ZMQ use), None if it has none
    or does not exist. :class:`lookup.LookupTimedOut` if the resolver does not answer within
    ``timeout_s`` or fails for now (EAI_AGAIN): that is not a judgement on the name."""
    try:
        found = lookup.getaddrinfo(host, None, timeout_s)
    except (OSError, UnicodeError, ValueError) as exc:
        if lookup.transient(exc):
            raise lookup.LookupTimedOut(f"looking up {host!r} failed for now ({exc})") from None
        return None
    return next((str(info[4][0]) for info in found if info[0] == socket.AF_INET), None)


def classify_host(host: str, timeout_s: float) -> HostKind:
    """What kind of address ``host`` is; names are looked up within ``timeout_s`` (else
    :class:`lookup.LookupTimedOut`)."""
    address = _literal(host)
    if address is None:
        found = ipv4_address(host, timeout_s)
        if found is None:
            return "unresolved"
        address = ipaddress.ip_address(found)
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_private or address.is_link_local:
        return "private"
    return "public"


def resolvable_name(host: str) -> str:
    """The resolver takes a host name as IDNA (Python's socket encodes it so): an empty or over-long
    label (``a..b``, 64 letters) or a lone surrogate fails there on every attempt, which a waiting engine
    would see only when its deadline ran out. Refused at load instead."""
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise ValueError(
            f"is not a host name the resolver can take ({exc.__cause__ or exc}); give an IP address or a "
            f"DNS name (labels of 1 to 63 characters)"
        ) from None
    return host
