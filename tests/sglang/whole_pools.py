"""SGLang 0.5.23 pools offloaded whole, and a store -> scramble -> restore round trip through layer groups.

Each case builds a real pool on CPU and reads it back through the pool's own accessors (with
dequantisation where the pool has it). :func:`roundtrip` registers it with :func:`register` into
``tests.multigroup_worker`` (FlexKV's multi-group worker, written from its code), copies pages
``SRC`` to the CPU, scrambles every plane, restores into pages ``DST``, and returns what differs.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from flexkv_adapter import adapt
from flexkv_adapter.flexkv import register
from flexkv_adapter.flexkv.plan import plan
from flexkv_adapter.flexkv.plan_types import sealed

from ..multigroup_worker import Client, Worker

SRC, DST = [1, 2], [2, 0]  # page 2 is both a source and a destination: restores must not read what they wrote


def _layers(pool: Any) -> range:
    start = getattr(pool, "start_layer", 0) or 0
    return range(start, start + pool.layer_num)


def read(pool: Any) -> list[tuple[str, torch.Tensor, int]]:
    """(what, tensor, rows per page) as the pool's own accessors return them, dequantised where it does."""
    page, out = pool.page_size, []
    if hasattr(pool, "main_pool"):  # MiniMax
        for lid in range(3):
            out += [(f"K{lid}", pool.get_key_buffer(lid), page), (f"V{lid}", pool.get_value_buffer(lid), page)]
        for lid in pool.index_kv_layer_id_mapping:
            k, v = pool.get_index_kv_buffer(lid)
            out += [(f"index K{lid}", k, page), (f"index V{lid}", v, page)]
        return out
    for lid in _layers(pool):
        out.append((f"K{lid}", pool.get_key_buffer(lid), page))
        if hasattr(pool, "v_buffer"):
            out.append((f"V{lid}", pool.get_value_buffer(lid), page))
        if hasattr(pool, "get_kv_scale_buffer"):  # MXFP8: scales per token, or interleaved per page at 128
            k, v = pool.get_kv_scale_buffer(lid)
            rows = page if k.shape[0] == pool.k_buffer[0].shape[0] else 1
            out += [(f"K scale {lid}", k, rows), (f"V scale {lid}", v, rows)]
        if hasattr(pool, "index_key_cache") and pool.index_k_with_scale_buffer[lid - _layers(pool).start].shape[0]:
            out.append((f"index {lid}", pool.get_index_k_with_scale_buffer(lid), 1))
    return out


def _fill(tensors: list[torch.Tensor], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in tensors:
        raw = t.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def model_config(p: Any, layer_groups: Any = "plan") -> SimpleNamespace:
    """FlexKV's ModelConfig fields for ``p``; its layer_groups from the plan unless given."""
    groups = p.flexkv_layer_groups() if layer_groups == "plan" else layer_groups
    return SimpleNamespace(
        num_layers=p.num_layer,
        num_kv_heads=p.num_kv_heads,
        head_size=p.head_size,
        dtype=p.dtype,
        tp_size=1,
        kv_dim=p.kv_dim,
        layer_groups=groups,
    )


def roundtrip(pool: Any, drop: str | None = None, reader: Any = read, make_worker: Any = Worker) -> list[str]:
    """Store SRC, scramble, restore into DST: every difference from what the pool (or ``reader``) should hold."""
    view = adapt(pool)
    p = plan(view)
    if drop is not None:  # the negative control: one plane left out of the registration, sealed again as if
        # plan() had made it so (register() refuses a plan changed since plan(): here the round trip is the check)
        p = sealed(replace(p, groups=tuple(g for g in p.groups if g.name != drop)))
    client = Client()
    register(p, client, model_config=model_config(p), attempts=1)
    call = client.calls[0]
    worker = make_worker(call, call["layer_groups"], len(SRC))
    raw = [(f"registered KV tensor {i}", t, view.page_size) for i, t in enumerate(view.tensors())]
    for plane in view.whole.planes if view.whole else ():
        raw += [(f"{plane.name} tensor {i}", t, plane.rows_per_block) for i, t in enumerate(plane.tensors)]
    _fill([t for _, t, _ in raw], 1)
    before = [(what, t.clone(), rows) for what, t, rows in raw + reader(pool)]
    worker.d2h(SRC, list(range(len(SRC))))
    _fill([t for _, t, _ in raw], 2)
    scrambled = [t.clone() for _, t, _ in raw + reader(pool)]
    worker.h2d(list(range(len(SRC))), DST)
    wrong = []
    for (what, old, rows), new, (_, after, _) in zip(before, scrambled, raw + reader(pool)):
        expected = new.clone()
        for b, d in zip(SRC, DST):
            expected[d * rows : (d + 1) * rows] = old[b * rows : (b + 1) * rows]
        pages = after.shape[0] // rows
        for page in range(pages):
            got, want = after[page * rows : (page + 1) * rows], expected[page * rows : (page + 1) * rows]
            if not torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)):
                wrong.append(f"{what} page {page}")
        if not torch.equal(after[pages * rows :].view(torch.uint8), new[pages * rows :].view(torch.uint8)):
            wrong.append(f"{what} rows after page {pages - 1}")
    return wrong


def connector_dsa_call(pool: Any) -> dict[str, Any]:
    """FlexKV's own SGLang connector's DSA registration: the indexer's head_size is a whole page row."""
    from flexkv.common.config import LayerGroupSpec
    from flexkv.common.storage import KVCacheLayout, KVCacheLayoutType

    p, index = plan(adapt(pool)), list(pool.index_k_with_scale_buffer)
    rows, row = index[0].shape
    groups = [
        LayerGroupSpec(len(p.tensors), 1, p.head_size, list(range(len(p.tensors))), p.dtype, 1),
        LayerGroupSpec(len(index), 1, row, list(range(len(index))), index[0].dtype, 1),  # connector.py:1824-1831
    ]
    indexer = KVCacheLayout(KVCacheLayoutType.LAYERFIRST, len(index), rows, 1, 1, row, 1, 1)  # :1996-2006
    return dict(
        kv_caches=[*p.tensors, *index],
        kv_layout=p.to_flexkv(),
        layer_groups=groups,
        gpu_layouts=[p.to_flexkv(), indexer],
        handles_per_group=[list(p.tensors), index],
    )
