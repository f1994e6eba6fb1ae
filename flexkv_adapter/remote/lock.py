"""One remote per node and master: an flock'd pid file, plus detection of FlexKV's own spawn.

A machine-wide abstract unix socket backs it up across lock directories. The lock file lives in
a directory other users cannot write to (``$XDG_RUNTIME_DIR``, else a
0700 directory of our own), is opened without following symlinks and must be a regular file we
own, so a planted link or FIFO can neither redirect the pid we write nor hang start-up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import threading
from pathlib import Path

from ..config.hosts import ipv4_address
from .exit_codes import ExitCode, RemoteExit

logger = logging.getLogger(__name__)


def _fail(message: str) -> RemoteExit:
    return RemoteExit(ExitCode.LOCAL_FILES, message)


def default_lock_dir() -> Path:
    """``$XDG_RUNTIME_DIR`` when it is a private directory of ours, else ``/tmp/flexkv-adapter-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private_dir(Path(runtime)):
        return Path(runtime)
    return Path(f"/tmp/flexkv-adapter-{os.geteuid()}")


def _private_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def prepare_lock_dir(configured: Path | None, create: bool = True) -> Path:
    """The directory to lock in: a configured one must exist; the default one is made 0700
    (``create=False``, for --dry-run: only checked if it exists)."""
    if configured is None:
        path = default_lock_dir()
        if not create and not os.path.lexists(path):
            return path
        try:
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise _fail(f"cannot create the lock directory {path} ({exc.strerror}); set lock_dir") from None
        if not _private_dir(path):
            raise _fail(
                f"lock directory {path} is not a directory owned by uid {os.geteuid()} and closed to "
                f"others (someone else may have made it); remove it or set lock_dir"
            )
        return path
    try:
        st = os.stat(configured)
    except FileNotFoundError:
        raise _fail(
            f"lock_dir {configured} does not exist; create it or set lock_dir to an existing directory"
        ) from None
    except OSError as exc:  # a name too long, a loop of links, a component that is a file
        raise _fail(
            f"lock_dir {configured} is unusable ({exc.strerror}); set lock_dir to an existing directory"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise _fail(f"lock_dir {configured} is not a directory")
    return configured


LOOKUP_S = 5.0  # start_remote passes connect_timeout_s


def lock_key(host: str, ports: tuple[int, int, int], lookup_s: float = LOOKUP_S) -> str:
    """The master's resolved IPv4 address (what ZMQ connects to) and ports, however it is spelled; the
    name is looked up within ``lookup_s`` (else ``lookup.LookupTimedOut``: a guessed key could let two
    remotes serve one master)."""
    address = ipv4_address(host, lookup_s) or host
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in address)
    return f"flexkv-remote-{safe}-{'-'.join(map(str, ports))}.lock"


def _machine_lock(name: str) -> socket.socket | int | None:
    """Bind the abstract unix socket ``name``: one per machine (network namespace), whatever the
    lock directory, user or environment; the kernel frees it when the process ends. If it is
    taken, the pid that holds it (0 if unknown); None if it cannot be bound at all (too long)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind("\0" + name)
        sock.listen(8)
        return sock
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            logger.warning("no machine-wide lock %s (%s): only the lock file guards this master", name, exc)
            return None
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        probe.connect("\0" + name)
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])
    return 0


def _answer_probes(sock: socket.socket) -> None:
    """Accept and close every probe (a contender, a dry run): SO_PEERCRED names this process to
    them at connect time, and unaccepted probes would fill the backlog, after which a held lock
    looks free to the next dry run and 'pid unknown' to the next contender."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:  # shut down by release()
            return
        conn.close()


class InstanceLock:
    """Exclusive lock for (resolved master address, ports); released when the process exits.

    Two locks: the pid file in ``lock_dir`` (what an operator can see) and a machine-wide abstract
    socket, so remotes started with different lock directories (a unit without ``XDG_RUNTIME_DIR``
    and a login shell with one) still exclude each other."""

    def __init__(self, lock_dir: Path, host: str, ports: tuple[int, int, int], lookup_s: float = LOOKUP_S) -> None:
        self.path = lock_dir / lock_key(host, ports, lookup_s)
        self._fd: int | None = None
        self._socket: socket.socket | None = None
        self._prober: threading.Thread | None = None

    def acquire(self) -> None:
        for _ in range(10):  # a holder that just released unlinked the file we opened: open the new one
            fd = self._open_locked()
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise _fail(f"lock file {self.path} keeps being replaced; is another start_remote restarting in a loop?")
        machine = _machine_lock(f"flexkv-adapter/{self.path.name}")
        if isinstance(machine, int):
            os.close(fd)
            raise RemoteExit(
                ExitCode.ALREADY_RUNNING,
                f"another start_remote (pid {machine or 'unknown'}) already serves this master (machine-wide "
                f"lock @flexkv-adapter/{self.path.name}, whatever its lock_dir); exactly one remote may connect "
                f"to a master",
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd, self._socket = fd, machine
        if machine is not None:
            self._prober = threading.Thread(target=_answer_probes, args=(machine,), name="lock-probes", daemon=True)
            self._prober.start()

    def _open_locked(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            why = "is a symlink (refusing to follow it)" if os.path.islink(self.path) else f"({exc.strerror})"
            raise _fail(f"cannot open lock file {self.path} {why}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            kind = "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file"
            raise _fail(f"lock file {self.path} is {kind} owned by uid {st.st_uid}; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RemoteExit(
                ExitCode.ALREADY_RUNNING,
                f"another start_remote (pid {holder}) already serves this master (lock {self.path}); "
                f"exactly one remote may connect to a master",
            ) from None
        return fd

    def holder(self) -> str | None:
        """Who holds the lock, without taking it (for --dry-run): the machine-wide socket's pid."""
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            probe.connect(f"\0flexkv-adapter/{self.path.name}")
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return str(struct.unpack("3i", creds)[0])
        return None

    def release(self) -> None:
        """Unlink the file while still holding it (no lock file is left behind), then let go."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self._fd).st_ino:
                    os.unlink(self.path)
            os.close(self._fd)
            self._fd = None
        if self._socket is not None:
            with contextlib.suppress(OSError):  # wakes the accepting thread; the name is free once closed
                self._socket.shutdown(socket.SHUT_RDWR)
            if self._prober is not None:
                self._prober.join(1.0)
            self._socket.close()
            self._socket = None


def is_flexkv_spawn(argv: list[str]) -> bool:
    """``python -c <script>`` whose script builds and starts FlexKV's ``TransferManagerOnRemote``."""
    if len(argv) < 3 or not Path(argv[0]).name.startswith("python") or argv[1] != "-c":
        return False
    script = argv[2]
    return "TransferManagerOnRemote" in script and ".start()" in script and "pickle.load" in script


def flexkv_spawned_remotes() -> list[int]:
    """Pids of remotes FlexKV's connectors spawned on this machine (``create_process``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if is_flexkv_spawn(argv):
            found.append(int(entry.name))
    return found
