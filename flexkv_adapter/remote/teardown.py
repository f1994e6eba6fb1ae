"""Stop FlexKV's remote within a deadline, without its ``shutdown()``.

``TransferManagerOnRemote.shutdown()`` cannot be used: before ``start()`` finished it raises
AttributeError, and after ready it never returns, because it ends in ``context.term()`` on the
context that still holds the bound ``<port>_gpu_register`` PULL and ``_control`` REP sockets
(its worker shutdown alone may also wait 600 s per worker). Instead, after ready: stop the polling
thread, close every socket the manager holds with linger 0 (bound ones included), let the transfer
engine send its workers their stop sentinel (they unpin memory) for up to ``reap_grace_s``, then
SIGTERM and finally SIGKILL whatever still runs. ZMQ contexts are left to process exit, never
``term()``'d. Before ready the manager thread is inside FlexKV, so only the children are stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .children import reap_descendants, workers_left

logger = logging.getLogger(__name__)

_POLLING_JOIN_S = 5.0
_SOCKETS = ("recv_from_client", "gpu_control_socket", "command_socket", "result_socket", "query_socket")


def _left(deadline: float, cap: float | None = None) -> float:
    left = max(0.0, deadline - time.monotonic())
    return left if cap is None else min(cap, left)


def _logged(stop: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            stop()
        except Exception as exc:
            logger.warning("transfer engine shutdown raised %r", exc)

    return run


def _unlink_ipc(register_port: object) -> None:
    """Remove the register/control socket files: libzmq would, but only once its context ends."""
    if not isinstance(register_port, str) or not register_port.startswith("ipc:///"):
        return  # tcp, or an abstract ipc name (@...): no file to remove
    for path in (register_port[6:], f"{register_port[6:]}_control"):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(path).st_mode) and not _bound_elsewhere(path):
                os.unlink(path)


def _bound_elsewhere(path: str) -> bool:
    """A socket of another process is bound at ``path`` (libzmq unlinks a path in use and binds it
    again): the file is that instance's now. Our fds are read first, so a socket of ours that
    closes meanwhile can only make this answer True, which leaves a stale file, never removes one."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                ours.add(target[8:-1])
    for line in Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]:
        fields = line.split(maxsplit=7)
        if len(fields) == 8 and fields[7] == path and fields[6] not in ours:
            return True
    return False


def _stop_started(tm: Any, deadline: float, reap_grace_s: float) -> None:
    for name, value in (("_shutdown_flag", True), ("_is_ready", False)):
        if hasattr(tm, name):
            setattr(tm, name, value)
    poller = getattr(tm, "_worker_thread", None)
    if isinstance(poller, threading.Thread):
        poller.join(_left(deadline, _POLLING_JOIN_S))
    if isinstance(poller, threading.Thread) and poller.is_alive():
        logger.warning("the manager's polling thread did not stop; leaving its sockets to process exit")
    else:
        for name in _SOCKETS:
            sock = getattr(tm, name, None)
            if sock is not None and callable(getattr(sock, "close", None)):
                sock.close(linger=0)
        _unlink_ipc(getattr(tm, "gpu_register_port", None))
        logger.debug("polling thread stopped, sockets closed")
    stop = getattr(getattr(tm, "transfer_engine", None), "shutdown", None)
    if callable(stop):
        engine = threading.Thread(target=_logged(stop), name="engine-shutdown", daemon=True)
        engine.start()
        until = time.monotonic() + _left(deadline, reap_grace_s)
        while engine.is_alive() and workers_left() and time.monotonic() < until:
            engine.join(0.05)  # the workers matter; the engine's own CUDA sync afterwards does not
        if workers_left():
            logger.warning("transfer engine workers still stopping after reap_grace_s=%gs", reap_grace_s)
        else:
            logger.debug("transfer engine workers stopped")


def stop_manager(tm: Any, started: bool, deadline: float, reap_grace_s: float) -> bool:
    """Stop the manager and every child by ``deadline``; False if a child had to be killed."""
    if tm is not None and started:
        _stop_started(tm, deadline, reap_grace_s)
        return reap_descendants(_left(deadline))
    if tm is not None:  # constructed: its register/control sockets are bound, and stay so until exit
        _unlink_ipc(getattr(tm, "gpu_register_port", None))
    return reap_descendants(_left(deadline, reap_grace_s))
