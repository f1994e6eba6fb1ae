"""The ``server_recv_port`` rule: FlexKV derives socket names from it, so it must be a usable ipc endpoint.

FlexKV's server binds the port and connects ``<port>_gpu_register`` and ``<port>_gpu_register_control``.
ZMQ meets a bad one only when a process binds it, after start_remote or the engine started; here it is
refused at load.
"""

from __future__ import annotations

import os

IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
IPC_SUFFIX = "_gpu_register_control"  # the longest name FlexKV derives from server_recv_port


def server_recv_port(value: str) -> str:
    """FlexKV binds ``<port>_gpu_register`` and ``<port>_gpu_register_control``: the port must be ipc, its
    path absolute (or abstract, ``@name``), a socket's, and fit a unix socket address (107 bytes), or ZMQ
    meets it only once the remote binds it, relative to whichever directory that process runs in."""
    if not value.startswith("ipc://"):  # tcp://h:p_gpu_register is no endpoint; ZMQ's names are case-sensitive
        raise ValueError(
            "is not an ipc:// endpoint: FlexKV connects to '<it>_gpu_register' and '<it>_gpu_register_control', "
            "socket names only under ipc://; give one like ipc:///tmp/flexkv_server"
        )
    path = value[6:]
    if not path.startswith(("/", "@")):
        raise ValueError(
            "is a relative ipc path: start_remote, the engine and FlexKV's server would each bind or connect it "
            "against their own working directory; give an absolute one, like ipc:///tmp/flexkv_server"
        )
    if path == "@" or (path.startswith("/") and path.rsplit("/", 1)[-1] in ("", ".", "..")):
        raise ValueError(
            "names no socket: a directory (a trailing '/', '.' or '..') or an empty abstract name; ZMQ "
            "refuses it only when FlexKV's server binds it. Give a socket path, like ipc:///tmp/flexkv_server"
        )
    if (longest := len(f"{path}{IPC_SUFFIX}".encode())) > IPC_PATH_MAX:
        raise ValueError(
            f"the ipc path plus FlexKV's '{IPC_SUFFIX}' is {longest} bytes; a unix socket path holds at "
            f"most {IPC_PATH_MAX}: choose a shorter path"
        )
    return same_as_flexkvs(value)


def same_as_flexkvs(value: str) -> str:
    """FlexKV reads ``FLEXKV_SERVER_RECV_PORT`` itself (``GLOBAL_CONFIG_FROM_ENV``, at import), in this
    process and the processes it starts: a different value from an argument, our own variable or the
    YAML file would be checked here, used for our messages and clean-up, and never by FlexKV."""
    flexkvs = os.environ.get("FLEXKV_SERVER_RECV_PORT")
    if flexkvs is not None and flexkvs != value:
        raise ValueError(
            f"differs from FLEXKV_SERVER_RECV_PORT={flexkvs!r}, which FlexKV reads itself: this value would be "
            f"validated but never used by FlexKV. Set one value (make them equal, or unset one)"
        )
    return value


__all__ = ["IPC_PATH_MAX", "IPC_SUFFIX", "same_as_flexkvs", "server_recv_port"]
