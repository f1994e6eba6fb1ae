"""Supervised bootstrap of FlexKV's remote transfer process (``TransferManagerOnRemote``).

Run ``scripts/start_remote.py`` (or ``flexkv-adapter start-remote``) on every non-zero node of a
multi-node deployment. Nothing here imports torch; FlexKV is imported only when the remote starts.
"""

from .exit_codes import ExitCode, RemoteExit
from .states import State

__all__ = ["ExitCode", "RemoteExit", "State"]
