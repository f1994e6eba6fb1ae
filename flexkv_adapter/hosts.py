"""Classify a master address: loopback, private, public, or unresolved (no DNS beyond /etc/hosts)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Literal

HostKind = Literal["loopback", "private", "public", "unresolved"]


def classify_host(host: str) -> HostKind:
    """What kind of address ``host`` is; names are resolved with the system resolver."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return "unresolved"
    if address.is_loopback:
        return "loopback"
    if address.is_private or address.is_link_local:
        return "private"
    return "public"
