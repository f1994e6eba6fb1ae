"""Whether a pid names a live process: one rule for the ready file (start_remote) and the engine's wait."""

from __future__ import annotations

import os
from pathlib import Path

PID_MAX = 2**22  # the kernel's largest pid_max: a bigger "pid" names no process (os.kill would overflow)


def alive(pid: int) -> bool:
    """A process with this id exists and has not ended (a zombie has); True where /proc hides its state."""
    if not 0 < pid <= PID_MAX:  # 0 and negatives would address process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it exited after os.kill: gone, not unknown
        return False
    except (OSError, IndexError):
        return True
