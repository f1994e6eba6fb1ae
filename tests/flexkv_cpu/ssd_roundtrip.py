"""FlexKV's real KVManager with a CPU tier AND an SSD tier, on an adapted pool.

``python -m tests.flexkv_cpu.ssd_roundtrip KIND STATE SOCKETS SSD_DIR`` (KIND: ``mha``/``mla``, SGLang's own
``MHATokenToKVPool``/``MLATokenToKVPool`` on CPU, or ``vllm``, a vLLM-0.33-style cache dict: per-layer
``[blocks, heads, block_size, C]`` views of one LBNHC buffer). ``flexkv_adapter`` plans the pool
(``adapt``/``plan``) and registers it with FlexKV's ``KVTPClient``; FlexKV's ``ModelConfig`` is built
from the plan. The CPU tier holds :data:`CPU_BLOCKS` blocks, the SSD tier :data:`SSD_BLOCKS` (FlexKV's
SSD allocator makes the file(s) in SSD_DIR; its SSD worker reads and writes them with ``SSDIOCTX`` and
``transfer_kv_blocks_ssd``, FlexKV's compiled code: only the GPU copy kernel is stood in).

Three sequences are stored (A, C, then B, as large as the CPU tier): FlexKV writes each through to the
SSD, and B evicts A and C from the CPU, so they live only on the SSD. A is restored into other blocks
(byte-exact, nothing around them written); then every SSD file is overwritten with :data:`JUNK` and C is
restored: the negative control, its bytes must be the junk (read from the SSD), not C's.
Prints ``RESULT {json}``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.e2e.engine_process import emit

from .counters import read_counters

PAGE, LAYERS, BLOCKS = 16, 2, 17  # SGLang pools: block 0 is the padding slot, never used here
CPU_BLOCKS, SSD_BLOCKS = 4, 16
JUNK = 0xA5
# sequence -> (first token id, source blocks); B fills the CPU tier, evicting A and C
SEQS = {"A": (1000, [1, 2, 3]), "C": (5000, [4, 5, 6]), "B": (9000, [7, 8, 9, 10])}
TARGETS = {"A": [11, 12, 13], "C": [14, 15, 16]}  # the other blocks each restore goes into
DEADLINE_S = 60.0


class Pool:
    """An engine's KV pool, read and written only through the engine's own accessors."""

    def __init__(self, kind: str, shm: Path) -> None:
        self.kind = kind
        torch.manual_seed(0)
        if kind == "vllm":
            self.source: Any = self._vllm(shm)
            self.planes = list(self.source.values())  # [blocks, heads, block_size, C] per layer
        else:
            from tests.sglang.pools import KW, MLA_ARGS, mp

            size = (BLOCKS - 1) * PAGE
            if kind == "mha":
                self.source = mp().MHATokenToKVPool(
                    size=size, page_size=PAGE, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=LAYERS, **KW
                )
            else:
                self.source = mp().MLATokenToKVPool(
                    size=size, page_size=PAGE, dtype=torch.bfloat16, layer_num=LAYERS, **MLA_ARGS, **KW
                )
            self.planes = self._sglang_planes()
            for plane in self.planes:
                plane.view(torch.uint8).copy_(torch.randint(0, 256, plane.view(torch.uint8).shape, dtype=torch.uint8))

    def _sglang_planes(self) -> list[torch.Tensor]:
        pool = self.source
        keys = [pool.get_key_buffer(layer) for layer in range(LAYERS)]
        return keys + ([pool.get_value_buffer(layer) for layer in range(LAYERS)] if self.kind == "mha" else [])

    @staticmethod
    def _vllm(shm: Path) -> dict[str, torch.Tensor]:
        """vLLM's one KV buffer [L, B, N, H, C], in a shared-memory file from the start (as tests/e2e/vllm_engine.py
        does: FlexKV's worker processes map the same bytes), and its per-layer views ``buffer[l].permute(0, 2, 1, 3)``.
        """
        shape = (LAYERS, BLOCKS, PAGE, 2, 16)
        nbytes = int(np.prod(shape)) * 2
        shm.mkdir(parents=True, exist_ok=True)
        path = shm / f"vllm_kv_{os.getpid()}"
        with open(path, "wb") as f:
            f.truncate(nbytes)
        raw = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        raw.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))
        buffer = raw.view(torch.bfloat16).view(shape)
        return {f"model.layers.{i}.self_attn.attn": buffer[i].permute(0, 2, 1, 3) for i in range(LAYERS)}

    def blocks(self, plane: torch.Tensor) -> torch.Tensor:
        """``plane`` with the block as its first axis (SGLang: token rows of a page; vLLM: already so)."""
        return plane if self.kind == "vllm" else plane.view(-1, PAGE, *plane.shape[1:])

    def read(self, blocks: list[int]) -> list[torch.Tensor]:
        return [self.blocks(p)[blocks].contiguous().view(torch.uint8).clone() for p in self.planes]

    def snapshot(self) -> list[torch.Tensor]:
        return [p.contiguous().view(torch.uint8).clone() for p in self.planes]

    def scribble(self, blocks: list[int]) -> None:
        for p in self.planes:
            self.blocks(p)[blocks[0] : blocks[-1] + 1] = 3.0

    def untouched_except(self, before: list[torch.Tensor], blocks: list[int]) -> bool:
        keep = [b for b in range(BLOCKS) if b not in blocks]
        now = self.snapshot()
        per_block = [t.view(BLOCKS, -1) for t in now], [t.view(BLOCKS, -1) for t in before]
        return all(torch.equal(n[keep], b[keep]) for n, b in zip(*per_block))


def _model_config(p: Any) -> Any:
    from flexkv.common.config import ModelConfig

    return ModelConfig(num_layers=p.num_layer, num_kv_heads=p.num_kv_heads, head_size=p.head_size,
                       kv_dim=p.kv_dim, dtype=p.dtype)  # fmt: skip


def _plan(pool: Pool) -> Any:
    import flexkv_adapter

    if pool.kind == "vllm":
        p = flexkv_adapter.plan(pool.source, kind="mha", page_size=PAGE)
        for t in p.tensors:  # registered as the shared file itself (tests/flexkv_cpu/shared_tensor.share)
            assert t.untyped_storage().filename, "a vLLM view is not in the shared KV file"
            t._flexkv_cpu_path = t.untyped_storage().filename
        return p
    return flexkv_adapter.plan(flexkv_adapter.adapt(pool.source))


def _ids(name: str) -> np.ndarray:
    first, blocks = SEQS[name]
    return np.arange(first, first + len(blocks) * PAGE, dtype=np.int64)


def _slots(blocks: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(b * PAGE, (b + 1) * PAGE) for b in blocks])


def _store(manager: Any, name: str) -> dict[str, Any]:
    """Store one sequence and wait until it is on the SSD.

    FlexKV's put task ends at its GPU->CPU copy; its CPU->SSD write goes on, and while it does the
    CPU blocks stay locked, so a put issued then can find no CPU block to evict (mask 0). So: the
    put_match is retried (the empty task cancelled) until its mask covers the sequence, and the task
    is waited on ``completely`` (its whole graph, the SSD write included)."""
    ids, blocks = _ids(name), SEQS[name][1]
    deadline, retries = time.monotonic() + DEADLINE_S, 0
    while True:
        task, mask = manager.put_match(ids)
        if mask.sum() == len(ids):
            break
        manager.cancel([task])
        assert time.monotonic() < deadline, f"FlexKV never accepted {name} (mask {int(mask.sum())}/{len(ids)})"
        retries += 1
        time.sleep(0.1)
    manager.launch([task], [_slots(blocks)[torch.from_numpy(mask)]])
    status = manager.wait([task], timeout=DEADLINE_S, completely=True)[task].status.value
    return {"status": status, "retries": retries}


def _cpu_hit(manager: Any, name: str) -> int:
    """Tokens of ``name`` FlexKV's CPU tier alone would serve (the probe task is cancelled)."""
    task, hit = manager.get_match(_ids(name), cpu_only=True)
    manager.cancel([task])
    return int(hit.sum())


def _restore(manager: Any, pool: Pool, name: str, state: Path) -> dict[str, Any]:
    target = TARGETS[name]
    pool.scribble(target)
    before = pool.snapshot()
    cpu_hit = _cpu_hit(manager, name)
    task, hit = manager.get_match(_ids(name))
    manager.launch([task], [_slots(target)[torch.from_numpy(hit)]])
    loaded = manager.wait([task], timeout=DEADLINE_S, completely=True)[task].status.value
    got, want = pool.read(target), pool.read(SEQS[name][1])
    return {
        "cpu_hit": cpu_hit, "hit": int(hit.sum()), "loaded": loaded,
        "exact": all(torch.equal(g, w) for g, w in zip(got, want)),
        "differs_everywhere": all(not torch.equal(g.view(len(target), -1)[i], w.view(len(target), -1)[i])
                                  for g, w in zip(got, want) for i in range(len(target))),
        "junk": all(bool((g == JUNK).all()) for g in got),
        "untouched": pool.untouched_except(before, target),
        "counters": read_counters(state),
    }  # fmt: skip


def _ssd_files(ssd: Path) -> list[Path]:
    return sorted(p for p in ssd.rglob("*") if p.is_file())


def _corrupt(ssd: Path) -> list[dict[str, Any]]:
    """Overwrite every byte of FlexKV's SSD cache file(s) with JUNK, on disk; what each held before."""
    out = []
    for path in _ssd_files(ssd):
        data = path.read_bytes()
        out.append({"name": path.name, "size": len(data), "nonzero": len(data) - data.count(0)})
        with open(path, "r+b") as f:
            f.write(bytes([JUNK]) * len(data))
            f.flush()
            os.fsync(f.fileno())
    return out


def main(kind: str, state: Path, sockets: Path, ssd: Path) -> None:
    from flexkv.common.config import CacheConfig
    from flexkv.kvmanager import KVManager
    from flexkv.server.client import KVTPClient

    from flexkv_adapter.flexkv.register import register

    pool = Pool(kind, Path(os.environ.get("FLEXKV_CPU_SHM_DIR", "/dev/shm")))
    p = _plan(pool)
    model = _model_config(p)
    cache = CacheConfig(tokens_per_block=PAGE, enable_cpu=True, num_cpu_blocks=CPU_BLOCKS, enable_ssd=True,
                        num_ssd_blocks=SSD_BLOCKS, ssd_cache_dir=[str(ssd)])  # fmt: skip
    manager = KVManager(model, cache, server_recv_port=f"ipc://{sockets}/server")
    manager.start()
    register(p, KVTPClient(manager.gpu_register_port, 0, 0), model_config=model, attempts=1)
    deadline = time.monotonic() + 120
    while not manager.is_ready():
        assert time.monotonic() < deadline, "FlexKV's transfer processes never became ready"
        time.sleep(0.1)
    stores = {name: _store(manager, name) for name in ("A", "C", "B")}
    restored = _restore(manager, pool, "A", state)
    files = _corrupt(ssd)
    corrupted = _restore(manager, pool, "C", state)
    manager.shutdown()
    emit({"kind": kind, "plan": str(p), "model": str(model), "stores": stores, "restored": restored,
          "ssd_files": files, "corrupted": corrupted})  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
