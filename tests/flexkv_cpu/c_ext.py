"""``flexkv.c_ext`` on CPU: FlexKV's compiled module where the tree has one (compiled.py), else hashing
(hasher.py) and any other name a do-nothing class; the copy kernel (kernel.py) in both.

The copy kernel here also keeps the data plane's own counters (:mod:`counters`: blocks copied each
way, per process, in ``$FLEXKV_CPU_STATE_DIR``) and, while the file ``$FLEXKV_CPU_STATE_DIR/perturb``
exists, overwrites with zeros the CPU-cache chunks a restore (H2D)
is about to read: the negative control of a round trip (FlexKV's CPU copy is wrong, so what the engine
reads back must differ). With ``FLEXKV_INDEX_ACCEL=0`` FlexKV uses its Python radix index, so
``CRadixTreeIndex`` and the other compiled classes are only imported, never built.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from . import hasher
from .compiled import GPU_ONLY, compiled_ext, load
from .counters import COUNTERS, count, perturbing
from .kernel import WORD, kernel
from .stubs import AnyNameModule

# Every "GPU" tensor this process mapped from a registration (shared_tensor.CpuTensorHandle.get_tensor):
# the kernel checks that each of its accesses lands inside one of them or the CPU cache.
MAPPED: list[torch.Tensor] = []


def _perturb(cpu: torch.Tensor, cpu_ids: torch.Tensor, args: tuple[Any, ...]) -> None:
    """Zero the chunks the restore reads, at the CPU addresses the kernel computes (layer, kv, block)."""
    cpu_kv, cpu_layer, cpu_block, chunk, start_layer, num_layers = args[7:13]
    kv_dim = args[16]
    flat = torch.empty(0, dtype=torch.uint8).set_(cpu.untyped_storage())
    base = cpu.data_ptr() - flat.data_ptr()
    for layer in range(start_layer, start_layer + num_layers):
        for c in cpu_ids.tolist():
            for kv in range(kv_dim):
                start = base + (layer * (cpu_layer // WORD) + kv * (cpu_kv // WORD) + c * (cpu_block // WORD)) * WORD
                flat[start : start + chunk // WORD * WORD].zero_()
    COUNTERS["perturbed_blocks"] += len(cpu_ids)


def _counted(copy: Any) -> Any:
    def transfer_kv_blocks(*args: Any, **kwargs: Any) -> None:
        gpu_ids, cpu_ids, cpu, h2d = args[0], args[5], args[6], bool(args[14])
        if h2d and perturbing():
            _perturb(cpu, cpu_ids, args)
        copy(*args, **kwargs)
        count(h2d, len(gpu_ids))

    return transfer_kv_blocks


def module(registered: list[torch.Tensor] | None = None, source: str | None = None) -> types.ModuleType:
    """The ``flexkv.c_ext`` module a CPU process imports (its kernel checks against ``registered``): FlexKV's
    compiled one where the FlexKV tree (``source``, else the first on ``sys.path``) has one, with only
    :data:`~tests.flexkv_cpu.compiled.GPU_ONLY` replaced; else the stand-ins."""
    so = compiled_ext([source] if source else None)
    ext: types.ModuleType
    if so is not None:
        ext = load(so)
        stubs = AnyNameModule("gpu-only")
        for name in GPU_ONLY:
            setattr(ext, name, getattr(stubs, name))
    else:
        ext = AnyNameModule("flexkv.c_ext")
        ext.__git_commit__ = "cpu-stand-in"  # type: ignore[attr-defined]
        ext.Hasher = hasher.Hasher  # type: ignore[attr-defined]
        ext.gen_hashes = hasher.gen_hashes  # type: ignore[attr-defined]
        ext.get_hash_size = hasher.get_hash_size  # type: ignore[attr-defined]
    ext.transfer_kv_blocks = _counted(kernel(MAPPED if registered is None else registered))  # type: ignore[attr-defined]
    return ext
