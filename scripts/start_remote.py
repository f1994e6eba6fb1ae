#!/usr/bin/env python3
"""Supervised bootstrap of FlexKV's remote transfer process on nodes 1..N-1.

Usage: ``python scripts/start_remote.py --master-host 10.0.0.1 --nnodes 2 --node-rank 1``
(or ``flexkv-adapter start-remote ...``). Exit statuses, systemd and Kubernetes: docs/start_remote.md.
"""

import sys
from pathlib import Path

try:  # the wrong interpreter (system python): say which one to use instead of a traceback
    from flexkv_adapter.remote.cli import entry_point
except ModuleNotFoundError as _missing:
    print(
        f"ERROR start_remote: {_missing} in {sys.executable}. Run `bash scripts/setup.sh`, then "
        f".venv/bin/python scripts/{Path(sys.argv[0]).name} (or `source .venv/bin/activate`), or pip install "
        f"the project into the environment where FlexKV is installed",
        file=sys.stderr,
    )
    sys.exit(2)  # ExitCode.SETTINGS: a bad invocation, like a command-line error (docs/start_remote.md)

if __name__ == "__main__":
    entry_point()
