"""One remote per node and master: an flock'd pid file, plus detection of FlexKV's own spawn."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import IO

from .exit_codes import ExitCode, RemoteExit

# FlexKV's in-engine spawn runs ``python -c <script>``; its script prints this on failure.
_FLEXKV_SPAWN_MARKER = "Error in TransferManager subprocess"


class InstanceLock:
    """Exclusive lock for (master host, ports); released when the process exits."""

    def __init__(self, lock_dir: Path, host: str, ports: tuple[int, int, int]) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)
        self.path = lock_dir / f"flexkv-remote-{safe}-{'-'.join(map(str, ports))}.lock"
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 (held for the life of the process)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RemoteExit(
                ExitCode.ALREADY_RUNNING,
                f"another start_remote (pid {holder}) already serves this master (lock {self.path}); "
                f"exactly one remote may connect to a master",
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def flexkv_spawned_remotes() -> list[int]:
    """Pids of remotes FlexKV's connectors spawned on this machine (``python -c`` with its script)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if " -c " in cmdline and _FLEXKV_SPAWN_MARKER in cmdline:
            found.append(int(entry.name))
    return found
