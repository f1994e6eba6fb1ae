"""Exit statuses of start_remote: one per way it can end, so supervisors can tell them apart."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of ``start_remote.py`` (documented in the README)."""

    OK = 0  # clean shutdown after SIGTERM/SIGINT, or a successful --dry-run
    SETTINGS = 2  # invalid settings or command line
    NODE_RANK_ZERO = 3  # node 0 runs the master, not a remote
    LOOPBACK_MASTER = 4  # loopback master address with nnodes > 1 (allow_loopback_master overrides)
    FLEXKV_MISSING = 5  # the transfer-manager class (FlexKV) cannot be imported
    ALREADY_RUNNING = 6  # another remote for this master holds the lock (or FlexKV spawned one)
    BAD_PORTS = 7  # invalid or duplicate master ports
    MASTER_UNREACHABLE = 10  # the master's ports did not accept TCP before connect_timeout_s
    HANDSHAKE_TIMEOUT = 11  # no config from the master within handshake_timeout_s
    GPU_TIMEOUT = 12  # local GPU ranks did not register within gpu_timeout_s
    MASTER_LOST = 13  # the master was unreachable for master_lost_s after ready
    CRASHED = 14  # the transfer manager raised
    FORCED = 15  # second signal, or shutdown exceeded grace_s


class RemoteExit(Exception):
    """Ends start_remote with ``code`` and a one-line ``message``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
