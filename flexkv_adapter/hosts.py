"""Classify a master address: loopback, private, public, unspecified or unresolved (system resolver)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Literal

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


def classify_host(host: str) -> HostKind:
    """What kind of address ``host`` is; names are resolved with the system resolver."""
    address = _literal(host)
    if address is None:
        try:
            address = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError, UnicodeError):
            return "unresolved"
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
