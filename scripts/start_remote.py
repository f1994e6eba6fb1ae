#!/usr/bin/env python3
"""Supervised bootstrap of FlexKV's remote transfer process on nodes 1..N-1.

Usage: ``python scripts/start_remote.py --master-host 10.0.0.1 --nnodes 2 --node-rank 1``
(or ``flexkv-adapter start-remote ...``). See the README for exit statuses, systemd and Kubernetes.
"""

from flexkv_adapter.remote.cli import entry_point

if __name__ == "__main__":
    entry_point()
