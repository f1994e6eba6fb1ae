"""FlexKV's real KVManager on CPU, one store and one restore: ``python -m tests.flexkv_cpu.roundtrip``.

Run with ``FLEXKV_CPU=1`` and ``tests/flexkv_cpu/site`` plus FlexKV's source on ``PYTHONPATH`` (every
process FlexKV spawns then gets the stand-ins of boot.py). A LAYERFIRST "GPU" pool of random bf16 is
registered through FlexKV's ``KVTPClient``, 3 pages are stored (``put_match``/``launch``/``wait``), the
pool is zeroed, and the pages are restored into other slots. Prints ``RESULT {json}``: whether every
restored byte equals the stored one, FlexKV's task statuses and the data plane's counters.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tests.e2e.engine_process import emit

from .counters import read_counters

LAYERS, PAGES, PAGE, HEADS, HEAD = 2, 8, 16, 1, 64


def main(state: Path, sockets: Path) -> None:
    from flexkv.common.config import CacheConfig, ModelConfig
    from flexkv.common.storage import KVCacheLayout, KVCacheLayoutType
    from flexkv.kvmanager import KVManager
    from flexkv.server.client import KVTPClient

    model = ModelConfig(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HEAD, kv_dim=2, dtype=torch.bfloat16)
    cache = CacheConfig(tokens_per_block=PAGE, enable_cpu=True, num_cpu_blocks=16)
    manager = KVManager(model, cache, server_recv_port=f"ipc://{sockets}/server")
    manager.start()
    torch.manual_seed(0)
    pool = [torch.randn(PAGES * PAGE, HEADS, HEAD, dtype=torch.bfloat16) for _ in range(2 * LAYERS)]
    shape = {"num_head": HEADS, "head_size": HEAD, "kv_dim": 2, "num_kv_heads": HEADS}
    shape.update(num_layer=LAYERS, num_block=PAGES, tokens_per_block=PAGE)
    layout = KVCacheLayout(KVCacheLayoutType.LAYERFIRST, **shape)
    KVTPClient(manager.gpu_register_port, 0, 0).register_to_server(pool, layout)
    deadline = time.monotonic() + 120
    while not manager.is_ready():
        assert time.monotonic() < deadline, "FlexKV's transfer processes never became ready"
        time.sleep(0.1)
    ids = np.arange(3 * PAGE, dtype=np.int64)
    put, mask = manager.put_match(ids)
    manager.launch([put], [torch.arange(PAGE, 4 * PAGE)[torch.from_numpy(mask)]])
    stored = manager.wait([put], timeout=30)[put].status.value
    want = [t[PAGE : 4 * PAGE].clone() for t in pool]
    restores = []
    for perturb in (False, True):  # the second restore is the negative control
        if perturb:
            (state / "perturb").touch()
        for t in pool:
            t.zero_()
        get, hit = manager.get_match(ids)
        manager.launch([get], [torch.arange(4 * PAGE, 7 * PAGE)[torch.from_numpy(hit)]])
        restores.append({
            "loaded": manager.wait([get], timeout=30)[get].status.value, "hit": int(hit.sum()),
            "exact": all(torch.equal(t[4 * PAGE : 7 * PAGE], w) for t, w in zip(pool, want)),
            "untouched": all(not t[: 4 * PAGE].any() and not t[7 * PAGE :].any() for t in pool),
            "counters": read_counters(state),
        })  # fmt: skip
    manager.shutdown()
    emit({"stored": stored, "restores": restores, "pid": os.getpid()})


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
