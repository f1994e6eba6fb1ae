"""Moved to :mod:`flexkv_adapter.lookup` (start_remote and doctor use it too, and import no engine code)."""

from __future__ import annotations

from ..lookup import MAX_IN_FLIGHT, AddrInfo, LookupTimedOut, getaddrinfo, transient

__all__ = ["MAX_IN_FLIGHT", "AddrInfo", "LookupTimedOut", "getaddrinfo", "transient"]
