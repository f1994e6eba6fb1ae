"""Bounded text for messages that embed user input (a value can be a 300 MB alias expansion)."""

from __future__ import annotations

import reprlib

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def clip(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` bounded in size and depth; never raises (repr of a 5,000-digit int does)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<int of {value.bit_length()} bits>"
    try:
        return clip(_REPR.repr(value), limit)
    except Exception as exc:  # a hostile __repr__ must not replace the error being reported
        return f"<{type(value).__name__} (repr failed: {type(exc).__name__})>"
