"""Standard streams that may be closed, or a pipe nobody reads: start_remote's exit status must not
depend on them (a unit with ``StandardOutput=null``, ``start_remote --dry-run | head -0``)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys


def _hold_std_fds() -> None:
    """Put /dev/null on each of fds 0-2 that is closed: otherwise the next file or socket opened (the
    lock file, the health port) gets that number, and whatever writes to "stderr" (a C library, a
    forked worker, a fatal-error dump) writes into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this very fd, or a lower one
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)


def guard_streams() -> None:
    """Replace a closed stdout/stderr (None in Python) with /dev/null; never let logging raise."""
    _hold_std_fds()
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process
    logging.raiseExceptions = False  # a handler on a broken stderr drops its line instead of a traceback


def _to_devnull(stream_name: str) -> None:
    """After EPIPE: send the stream (and its fd) to /dev/null, so no later flush fails."""
    stream = getattr(sys, stream_name)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def say(text: str) -> None:
    """Print to stdout; a closed or unread stdout drops the text, it does not end the run."""
    try:
        print(text, flush=True)
    except (OSError, ValueError):  # BrokenPipeError, a closed file
        _to_devnull("stdout")


def flush_all() -> None:
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).flush()
        except (OSError, ValueError, AttributeError):
            _to_devnull(name)
