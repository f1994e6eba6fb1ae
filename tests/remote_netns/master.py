"""Node A: FlexKV's real master, ``TransferManagerMultiNodeHandle``, driven over stdin/stdout.

``python -m tests.remote_netns.master HOST PORTS REGISTER_PORT [hold]``: binds the three ports on
HOST (node A's address), prints ``bound``, sends the config once from a thread (FlexKV's
``send_config_to_remotes`` blocks until a remote connects; with ``hold``, only after a ``send``
line on stdin, as node 0's engine sends it when it starts), prints ``config-sent``, and answers
each ``ready`` line with ``ready True|False`` (FlexKV's ``is_ready()``, a query to the remote).
EOF on stdin ends it; the tests kill it with SIGKILL to make node 0 die.
"""

from __future__ import annotations

import os
import sys
import threading

from . import flexkv_cpu


def main(host: str, ports: str, register_port: str, hold: bool) -> None:
    tm = flexkv_cpu.load()
    from flexkv.common.config import CacheConfig, ModelConfig

    model = ModelConfig(num_layers=2, num_kv_heads=1, head_size=8, tp_size=4, nnodes=2)  # 2 GPUs per node
    model.freeze()
    master = tm.TransferManagerMultiNodeHandle(
        model, CacheConfig(tokens_per_block=16), register_port, host, tuple(ports.split(","))
    )
    print("bound", flush=True)

    def send() -> None:
        master.send_config_to_remotes()
        print("config-sent", flush=True)

    sender = threading.Thread(target=send, daemon=True)
    if not hold:
        sender.start()
    master.start()
    for line in sys.stdin:
        if line.strip() == "ready":
            print(f"ready {master.is_ready()}", flush=True)
        elif line.strip() == "send" and not sender.is_alive():
            sender.start()
    os._exit(0)  # FlexKV's shutdown() ends in context.term(): a process exit is what node 0's crash is


if __name__ == "__main__":
    main(*sys.argv[1:4], hold=sys.argv[4:5] == ["hold"])
