"""Hypothesis strategies for pools with state beside their KV, each with the options a caller may pass.

Every kind the hybrid policy decides on: SWA and linear-attention wrappers (MHA or MLA children, with or
without Mamba state), MiniMax (index KV, or K-only index), quantised pools with scale planes, DSA-like
pools with an indexer, and raw paged KV with scales (the path plan() used to register as is). Layer ids
in the wrappers' metadata come as Python, numpy or 0-d tensor integers, or as hostile values (bools,
floats, negatives, two keys for one id) that must be refused the same way everywhere.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

PS, HEADS, DIM, ROWS = 4, 2, 4, 3 * 4 + 4  # one dummy page, as SGLang's pools hold size + page rows


DTYPE = torch.bfloat16


# How an id is written into a wrapper's metadata; the hostile ones must be refused (InconsistentLayersError).
ID_TYPES = {
    "int": int,
    "numpy-int64": np.int64,
    "numpy-int32": np.int32,
    "torch-0d": lambda i: torch.tensor(i),
}


HOSTILE_IDS = {
    "bool": lambda i: True,
    "float": float,
    "negative": lambda i: -1 - i,
    "1-d tensor": lambda i: torch.tensor([i]),
}


def _mha(ids: list[int], rows: int = ROWS, claim: bool = True) -> SimpleNamespace:
    pool = SimpleNamespace(
        k_buffer=[torch.randn(rows, HEADS, DIM).to(DTYPE) for _ in ids],
        v_buffer=[torch.randn(rows, HEADS, DIM).to(DTYPE) for _ in ids],
        page_size=PS,
        layer_num=len(ids),
        head_num=HEADS,
        head_dim=DIM,
    )
    if claim:  # SGLang patches the wrapper's global ids onto an MHA child
        pool.model_layer_ids = list(ids)
    return pool


def _mla(ids: list[int], rows: int = ROWS) -> SimpleNamespace:
    return SimpleNamespace(
        kv_buffer=[torch.randn(rows, 1, 2 * DIM).to(DTYPE) for _ in ids],
        page_size=PS,
        layer_num=len(ids),
        start_layer=0,
    )


def _child(kind: str, ids: list[int], rows: int = ROWS) -> SimpleNamespace:
    if kind == "mla-paged":  # raw per-layer pages [P, T, D]: a reading plan() registers as is
        return SimpleNamespace(kv_buffer=[torch.randn(rows // PS, PS, 2 * DIM).to(DTYPE) for _ in ids], page_size=PS)
    return _mha(ids, rows) if kind == "mha" else _mla(ids, rows)


def _split(draw: st.DrawFn, n: int) -> tuple[list[int], list[int]]:
    """Layer ids 0..n-1 split into two non-empty sets, each in a drawn sub-pool order."""
    ids = draw(st.permutations(list(range(n))))
    cut = draw(st.integers(1, n - 1))
    return sorted(ids[:cut]), sorted(ids[cut:])


@st.composite
def hybrid_pools(draw: st.DrawFn) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(pool, options, notes): one pool of a kind the policy decides on, and options to pass."""
    kind = draw(st.sampled_from(["swa", "linear", "minimax", "quantised", "dsa", "raw-paged-scales"]))
    child = draw(st.sampled_from(["mha", "mla", "mla-paged"] if kind == "swa" else ["mha", "mla"]))
    as_id = draw(st.sampled_from(sorted(ID_TYPES) + sorted(HOSTILE_IDS)))
    conv = ID_TYPES.get(as_id) or HOSTILE_IDS[as_id]
    notes: dict[str, Any] = {"kind": kind, "child": child, "ids": as_id}
    n = draw(st.integers(2, 5))
    if kind == "swa":
        full, swa = _split(draw, n)
        flag = draw(st.sampled_from([bool, np.bool_]))
        mapping = {conv(g): (conv(i), flag(False)) for i, g in enumerate(full)}
        mapping.update({conv(g): (conv(i), flag(True)) for i, g in enumerate(swa)})
        pool: Any = SimpleNamespace(
            full_kv_pool=_child(child, full), swa_kv_pool=_child(child, swa, rows=2 * PS), layers_mapping=mapping
        )
    elif kind == "linear":
        full, mamba_ids = _split(draw, n)
        mamba = None
        if draw(st.booleans()):
            state = SimpleNamespace(conv=[torch.zeros(len(mamba_ids), 3, 4)], temporal=torch.zeros(3, 2, 4))
            mamba = SimpleNamespace(mamba_cache=state, mamba_layer_ids=[conv(i) for i in mamba_ids])
        mapping = {conv(g): conv(i) for i, g in enumerate(full)}
        pool = SimpleNamespace(full_kv_pool=_child(child, full), full_attention_layer_id_mapping=mapping)
        if mamba is not None or draw(st.booleans()):
            pool.mamba_pool = mamba
    elif kind == "minimax":  # MiniMax's main pool is MHA only
        main_ids = list(range(n))
        index_ids = sorted(draw(st.sets(st.sampled_from(main_ids), min_size=1)))
        index_kv = _mha(index_ids, claim=False)
        pool = SimpleNamespace(
            main_pool=_mha(main_ids),
            index_kv_pool=index_kv,
            index_kv_layer_id_mapping={conv(g): conv(i) for i, g in enumerate(index_ids)},
        )
        if draw(st.booleans()):  # K-only index layers: no exact registration, refused by name
            pool.index_k_pool = SimpleNamespace(k_buffer=[torch.zeros(ROWS, 1, DIM, dtype=DTYPE)])
            pool.index_k_layer_id_mapping = {conv(main_ids[-1]): conv(0)}
    elif kind == "quantised":
        pool = _child(child, list(range(n)))
        names = ["k_scale_buffer", "v_scale_buffer"] if child == "mha" else ["kv_scale_buffer"]
        for name in names:
            setattr(pool, name, [torch.zeros(ROWS, HEADS * DIM // 4, dtype=torch.uint8) for _ in range(n)])
    elif kind == "dsa":
        pool = _mla(list(range(n)))
        pool.index_k_with_scale_buffer = [torch.zeros(ROWS // PS, PS * 8, dtype=torch.uint8) for _ in range(n)]
    else:  # raw paged MLA KV [pages, page, dim] with per-token scales: the reading plan() registers as is
        pool = SimpleNamespace(
            kv_buffer=[torch.randn(ROWS // PS, PS, 2 * DIM).to(DTYPE) for _ in range(n)],
            kv_scale_buffer=[torch.zeros(ROWS, 4, dtype=torch.uint8) for _ in range(n)],
        )
    if kind in ("swa", "linear", "minimax"):
        for sub in (getattr(pool, a, None) for a in ("full_kv_pool", "swa_kv_pool", "main_pool")):
            if getattr(sub, "model_layer_ids", None) is not None:  # SGLang's patched global ids, same type
                sub.model_layer_ids = [conv(i) for i in sub.model_layer_ids]
        if draw(st.booleans()):
            pool.page_size = PS
    options: dict[str, Any] = {}
    if kind == "swa" and draw(st.booleans()):  # attrs= into the full sub-pool: its layers labelled by the mapping
        names = ["k_buffer", "v_buffer"] if child == "mha" else ["kv_buffer"]
        options["attrs"] = [f"full_kv_pool.{n}" for n in names]
    if (mode := draw(st.sampled_from([None, "error", "attention_only"]))) is not None:
        options["hybrid"] = mode
    if (asked := draw(st.sampled_from([None, "mha", "mla"]))) is not None:
        options["kind"] = asked
    if draw(st.booleans()):
        options["page_size"] = draw(st.sampled_from([PS, 2 * PS]))
    return pool, options, notes


@st.composite
def duplicated_ids(draw: st.DrawFn) -> tuple[Any, str]:
    """A wrapper whose metadata names one layer twice through keys that are distinct dict keys."""
    where = draw(st.sampled_from(["layers_mapping", "full_attention_layer_id_mapping", "model_layer_ids"]))
    if where == "layers_mapping":
        mapping = {1: (0, False), torch.tensor(1): (1, False), 0: (0, True)}
        pool = SimpleNamespace(full_kv_pool=_mha([1, 2], claim=False), swa_kv_pool=_mha([0]), layers_mapping=mapping)
    elif where == "full_attention_layer_id_mapping":
        pool = SimpleNamespace(full_kv_pool=_mha([1, 2], claim=False), mamba_pool=None)
        pool.full_attention_layer_id_mapping = {1: 0, torch.tensor(1): 1}
    else:
        sub = _mha([1, 2])
        sub.model_layer_ids = draw(st.sampled_from([[1, 1], np.array([1, 1]), torch.tensor([1, 1])]))
        state = SimpleNamespace(conv=[torch.zeros(1, 3, 4)], temporal=torch.zeros(3, 2, 4))
        pool = SimpleNamespace(full_kv_pool=sub, mamba_pool=SimpleNamespace(mamba_cache=state, mamba_layer_ids=[0]))
    return pool, where
