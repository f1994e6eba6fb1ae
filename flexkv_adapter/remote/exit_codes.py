"""Exit statuses of start_remote: one per way it can end, so supervisors can tell them apart."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of ``start_remote.py`` (documented in the README)."""

    OK = 0  # clean shutdown after SIGTERM/SIGINT/SIGHUP, or a successful --dry-run
    SETTINGS = 2  # invalid settings, command line or --config file
    NODE_RANK_ZERO = 3  # node 0 runs the master, not a remote
    LOOPBACK_MASTER = 4  # loopback master address with nnodes > 1 (allow_loopback_master overrides)
    FLEXKV_MISSING = 5  # the transfer-manager class (FlexKV) cannot be imported, or its import raised
    ALREADY_RUNNING = 6  # another remote for this master holds the lock (or FlexKV spawned one)
    BAD_PORTS = 7  # invalid or duplicate master ports
    LOCAL_FILES = 8  # lock directory/file or ready-file directory unusable (missing, wrong type, not ours)
    HEALTH_ENDPOINT = 9  # the health endpoint cannot listen (port in use, address not available)
    MASTER_UNREACHABLE = 10  # the master's ports did not accept TCP before connect_timeout_s
    HANDSHAKE_TIMEOUT = 11  # no config from the master within handshake_timeout_s (it is sent once)
    GPU_TIMEOUT = 12  # local GPU ranks did not register within gpu_timeout_s
    MASTER_LOST = 13  # the master that sent the config went away (final: FlexKV never re-handshakes)
    CRASHED = 14  # the transfer manager raised
    FORCED = 15  # second signal, or workers had to be killed to end within grace_s
    ENGINE_TIMEOUT = 16  # engine start-up (CPU cache, workers) took longer than engine_timeout_s


class RemoteExit(Exception):
    """Ends start_remote with ``code`` and a one-line ``message``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
