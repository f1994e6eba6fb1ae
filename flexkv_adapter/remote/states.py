"""The remote's lifecycle states: logged on change, only ever forward, mirrored by a ready file."""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Any

from ..config.pids import alive
from .exit_codes import ExitCode, RemoteExit

logger = logging.getLogger(__name__)


class State(str, Enum):
    WAITING_FOR_MASTER = "waiting_for_master"
    HANDSHAKE = "handshake"  # connected; waiting for the master's one config message
    WAITING_FOR_GPUS = "waiting_for_gpus"  # config received, register port bound, ranks registering
    STARTING_ENGINE = "starting_engine"  # all ranks registered; CPU cache and workers starting
    READY = "ready"
    SHUTTING_DOWN = "shutting_down"
    FAILED = "failed"


_ORDER = {state: rank for rank, state in enumerate(State)}


class ReadyFile:
    """A JSON file present only while ready, replaced atomically through a private temporary file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def check(self) -> None:
        """Fail at start-up, not at ready: a writable directory, and no directory at the path."""
        parent = self.path.parent
        try:
            if not parent.is_dir():
                raise RemoteExit(ExitCode.LOCAL_FILES, f"ready_file directory {parent} does not exist")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise RemoteExit(ExitCode.LOCAL_FILES, f"ready_file directory {parent} is not writable")
            if stat.S_ISDIR(os.lstat(self.path).st_mode):
                raise RemoteExit(ExitCode.LOCAL_FILES, f"ready_file {self.path} is a directory")
        except FileNotFoundError:
            pass  # no ready file yet: the usual case
        except OSError as exc:  # a name too long for the kernel, a loop of links
            raise RemoteExit(ExitCode.LOCAL_FILES, f"ready_file {self.path} is unusable ({exc.strerror})") from None

    def write(self, snapshot: dict[str, Any]) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            try:
                os.fchmod(fd, 0o644)  # as readable as a plain file; mkstemp makes it 0600
                with os.fdopen(fd, "w") as f:
                    json.dump(snapshot, f)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            logger.error("cannot write ready_file %s: %s", self.path, exc)

    def owner(self) -> int | None:
        """The pid recorded in the file now (None: no file, or not a ready file of ours)."""
        try:  # never block on a FIFO planted at the path
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return None
                data = json.loads(os.pread(fd, 65536, 0))
            finally:
                os.close(fd)
        except (OSError, ValueError, RecursionError):
            return None
        pid = data.get("pid") if isinstance(data, dict) else None
        return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None

    def in_use_by(self) -> int | None:
        """The live start_remote (not this one) whose ready file this is, if any; a reused pid is not."""
        pid = self.owner()
        return pid if pid is not None and pid != os.getpid() and _a_remote(pid) else None

    def claim(self) -> None:
        """At start-up, under the lock: refuse a file a live remote wrote; remove a dead one's (stale,
        it says ready while this remote waits)."""
        pid = self.in_use_by()
        if pid is not None:
            raise RemoteExit(
                ExitCode.LOCAL_FILES,
                f"ready_file {self.path} belongs to another running remote (pid {pid}); give each remote its own",
            )
        if self.owner() is not None:
            self._unlink()

    def remove(self) -> None:
        """Remove the file only if this process wrote it (another remote's stays)."""
        if self.owner() == os.getpid():
            self._unlink()

    def _unlink(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            logger.error("cannot remove ready_file %s: %s", self.path, exc)


def _a_remote(pid: int) -> bool:
    """A live process that may be start_remote (its command line says so, or cannot be read)."""
    if not alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # it exited after os.kill: gone, not unknown
        return False
    except OSError:  # hidden from us (another user's, hidepid): may be a remote
        return True
    return b"start_remote" in argv or b"start-remote" in argv


class StateTracker:
    """Thread-safe current state; refuses to move backwards; writes the ready file while READY."""

    def __init__(self, info: dict[str, Any], ready_file: ReadyFile | None = None) -> None:
        self._lock = threading.RLock()  # the SIGUSR1 handler reads it on the main thread
        self._state = State.WAITING_FOR_MASTER
        self._since = time.time()
        self._detail = ""
        self._info = info
        self._ready_file = ready_file
        logger.info("state: %s", self._state.value)

    @property
    def state(self) -> State:
        return self._state

    def set(self, state: State, detail: str = "") -> bool:
        """Move to ``state`` if it is later than the current one; True if it moved."""
        with self._lock:
            if _ORDER[state] <= _ORDER[self._state]:
                if state is not self._state:
                    logger.debug("ignored %s after %s", state.value, self._state.value)
                return False
            self._state, self._since, self._detail = state, time.time(), detail
        logger.info("state: %s%s", state.value, f" ({detail})" if detail else "")
        if self._ready_file is not None:
            if state is State.READY:
                self._ready_file.write(self.snapshot())
            else:
                self._ready_file.remove()
        return True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self._state.value,
                "since": self._since,
                "detail": self._detail,
                "pid": os.getpid(),
                **self._info,
            }
