"""Exit statuses of start_remote: one per way it can end, so supervisors can tell them apart."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of ``start_remote.py`` (table: docs/start_remote.md)."""

    OK = 0  # clean shutdown after SIGTERM/SIGINT/SIGHUP, or a --dry-run that found nothing a real start would refuse
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


# What each status means and whether a service manager should restart on it: the one source of the
# exit summary in --help (remote/args.py) and the table in docs/start_remote.md (a test keeps the page in step).
MEANINGS: dict[ExitCode, tuple[str, str]] = {
    ExitCode.OK: (
        "clean shutdown after SIGTERM/SIGINT/SIGHUP, or `--dry-run` when a real start would start (it changes "
        "nothing; a master that does not answer yet and a FlexKV-spawned remote for another master are warnings; "
        "otherwise it exits with the status the real start would give)",
        "no",
    ),
    ExitCode.SETTINGS: (
        "invalid settings, command line or `--config` file (the line names the key, value and source): also "
        "a NUL, newline or other control character or an unencodable one in a path, address or name, a "
        "`lock_dir` or `ready_file` that is empty, relative or over PATH_MAX/NAME_MAX, a "
        "`server_recv_port` that is not ipc://, relative, names a directory or an empty abstract name, or is too "
        "long for a unix socket, "
        "a duration its consumer cannot take "
        "(`probe_interval_s` and `master_lost_s` at most 2147483.647 s, ZMQ's 32-bit milliseconds; "
        "`failed_visible_s` at most 60 s; others at most 1e9 s), a `transfer_manager` that is not "
        "`module:Class` or not a transfer manager (no "
        "`start()`, no `master_host`/`master_ports`); a master_host that does not resolve or is an IPv6 "
        "address (FlexKV's ZMQ sockets are IPv4-only)",
        "no",
    ),
    ExitCode.NODE_RANK_ZERO: ("node rank 0: node 0 runs the master, not a remote", "no"),
    ExitCode.LOOPBACK_MASTER: (
        "loopback master address while `nnodes > 1` (`--allow-loopback-master` for one-machine tests)",
        "no",
    ),
    ExitCode.FLEXKV_MISSING: (
        "the transfer manager (FlexKV) cannot be imported, or its import raised; the line says why "
        "(`--dry-run` too, after its plan)",
        "no",
    ),
    ExitCode.ALREADY_RUNNING: (
        "another remote serves this master (the lock names its pid), or FlexKV's engine spawned a remote "
        "for this master or for one its sockets do not tell (a spawn for another master is a warning)",
        "no",
    ),
    ExitCode.BAD_PORTS: ("invalid or duplicate master ports", "no"),
    ExitCode.LOCAL_FILES: (
        "lock directory missing, not a directory or unwritable; lock path a symlink, directory, FIFO or not "
        "ours; ready-file directory missing or unwritable, a directory at its path, or the ready file of "
        "another running remote",
        "no",
    ),
    ExitCode.HEALTH_ENDPOINT: (
        "the health endpoint cannot listen (port in use, address not available, a host name that cannot be encoded)",
        "yes",
    ),
    ExitCode.MASTER_UNREACHABLE: (
        "the master's ports did not accept TCP within `connect_timeout_s`, or its name did not resolve within "
        "it (the resolver did not answer, or failed for now)",
        "yes",
    ),
    ExitCode.HANDSHAKE_TIMEOUT: (
        "no config from the master within `handshake_timeout_s` (FlexKV sends it once)",
        "after node 0",
    ),
    ExitCode.GPU_TIMEOUT: (
        "local GPU ranks did not register within `gpu_timeout_s` (the line names the register port FlexKV "
        "bound from the master's config, and how many registered)",
        "yes",
    ),
    ExitCode.MASTER_LOST: (
        "the master that sent the config went away or restarted (final; watched from the config on, not only "
        "after ready)",
        "after node 0",
    ),
    ExitCode.CRASHED: ("the transfer manager raised", "yes"),
    ExitCode.FORCED: ("forced exit: a second signal, or workers had to be killed to end within `grace_s`", "-"),
    ExitCode.ENGINE_TIMEOUT: (
        "the transfer engine did not start within `engine_timeout_s` after registration",
        "yes",
    ),
}
