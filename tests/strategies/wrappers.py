"""Hybrid wrappers whose metadata or children hide state the policy must not read silently wrong.

A DSA child whose indexer the wrapper does not expose itself, id mappings that are present but not
mappings (a list of pairs, a list of ids, a string) or that read two ways, a child with planes reached
through attrs=, and linear-attention wrappers with no record of where their attention layers sit.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import strategies as st

from .hybrids import PS, ROWS, _mha, _mla, _split


def _dsa_child(ids: list[int], skipped: set[int]) -> SimpleNamespace:
    child = _mla(ids)
    child.index_k_with_scale_buffer = [
        torch.zeros(0 if i in skipped else ROWS // PS, PS * 8, dtype=torch.uint8) for i in range(len(ids))
    ]
    return child


def _mamba(ids: list[int]) -> SimpleNamespace:
    state = SimpleNamespace(conv=[torch.zeros(len(ids), 3, 4)], temporal=torch.zeros(3, 2, 4))
    return SimpleNamespace(mamba_cache=state, mamba_layer_ids=list(ids))


@st.composite
def wrappers_with_a_dsa_child(draw: st.DrawFn) -> tuple[Any, tuple[int, ...]]:
    """(wrapper, the attention ids whose indexer rows are real): SWA or linear wrapper over a DSA child."""
    n = draw(st.integers(3, 6))
    full, other = _split(draw, n)
    skipped = set(draw(st.sets(st.integers(0, len(full) - 1), max_size=len(full) - 1)))
    child = _dsa_child(full, skipped)
    if draw(st.booleans()):
        mapping = {g: (i, False) for i, g in enumerate(full)} | {g: (i, True) for i, g in enumerate(other)}
        pool: Any = SimpleNamespace(full_kv_pool=child, swa_kv_pool=_mla(other, rows=2 * PS), layers_mapping=mapping)
    else:
        pool = SimpleNamespace(
            full_kv_pool=child,
            full_attention_layer_id_mapping={g: i for i, g in enumerate(full)},
            mamba_pool=_mamba(other) if draw(st.booleans()) else None,
        )
    return pool, tuple(g for i, g in enumerate(full) if i not in skipped)


@st.composite
def unreadable_id_maps(draw: st.DrawFn) -> tuple[Any, str]:
    """A linear or MiniMax wrapper whose id mapping is present but is no mapping (ignored before)."""
    full, other = _split(draw, draw(st.integers(3, 6)))
    shape = draw(st.sampled_from(["pairs", "ids", "text", "set"]))
    as_map = {
        "pairs": lambda ids: [(g, i) for i, g in enumerate(ids)],
        "ids": list,
        "text": lambda ids: ",".join(map(str, ids)),
        "set": set,
    }[shape]
    if draw(st.booleans()):
        sub = _mha(full, claim=draw(st.booleans()))
        pool: Any = SimpleNamespace(
            full_kv_pool=sub, full_attention_layer_id_mapping=as_map(full), mamba_pool=_mamba(other)
        )
        return pool, "full_attention_layer_id_mapping"
    main = list(range(len(full) + len(other)))
    pool = SimpleNamespace(main_pool=_mha(main), index_kv_pool=_mha(full, claim=False))
    pool.index_kv_layer_id_mapping = as_map(full)
    return pool, "index_kv_layer_id_mapping"


def _planes_child(kind: str, ids: list[int]) -> tuple[SimpleNamespace, list[torch.Tensor]]:
    """A child pool with planes beside its KV (a DSA indexer or quantisation scales), and those planes."""
    if kind == "dsa":
        child = _dsa_child(ids, set())
        return child, list(child.index_k_with_scale_buffer)
    child = _mha(ids, claim=False) if kind == "mha-scales" else _mla(ids)
    names = ["k_scale_buffer", "v_scale_buffer"] if kind == "mha-scales" else ["kv_scale_buffer"]
    for name in names:
        setattr(child, name, [torch.zeros(ROWS, 2, dtype=torch.uint8) for _ in ids])
    return child, [t for name in names for t in getattr(child, name)]


@st.composite
def attrs_into_a_child_with_planes(draw: st.DrawFn) -> tuple[Any, dict[str, Any], list[torch.Tensor]]:
    """(pool, options with attrs= naming a child's KV, the child's planes): a wrapper or a plain holder."""
    kind = draw(st.sampled_from(["dsa", "mha-scales", "mla-scales"]))
    full, other = _split(draw, draw(st.integers(3, 5)))
    child, planes = _planes_child(kind, full)
    outer = draw(st.sampled_from(["linear", "holder"]))
    if outer == "linear":
        pool: Any = SimpleNamespace(
            full_kv_pool=child, full_attention_layer_id_mapping={g: i for i, g in enumerate(full)}, mamba_pool=None
        )
        if draw(st.booleans()):
            pool.mamba_pool = _mamba(other)
        owner = "full_kv_pool"
    else:
        pool, owner = SimpleNamespace(inner=child), "inner"
    names = ["k_buffer", "v_buffer"] if kind == "mha-scales" else ["kv_buffer"]
    options: dict[str, Any] = {"attrs": [f"{owner}.{n}" for n in names]}
    if (mode := draw(st.sampled_from([None, "error", "attention_only"]))) is not None:
        options["hybrid"] = mode
    return pool, options, planes


class _IterLies(dict):  # type: ignore[type-arg]
    """items() says one thing, iteration and [] (SGLang's reading) another: layers swapped."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(dict.keys(self))[::-1])

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        values = list(dict.values(self))
        return values[::-1][list(dict.keys(self)).index(key)]


class _Alternating:
    """A wrapper whose mapping property gives another dict on every read."""

    def __init__(self, attr: str, first: dict[Any, Any], second: dict[Any, Any]) -> None:
        self._attr, self._reads, self._maps = attr, 0, (first, second)

    def __getattr__(self, name: str) -> Any:
        if name == self.__dict__.get("_attr"):
            self.__dict__["_reads"] += 1
            return self._maps[self.__dict__["_reads"] % 2]
        raise AttributeError(name)


@st.composite
def mappings_read_two_ways(draw: st.DrawFn) -> tuple[Any, str, bool, tuple[int, ...]]:
    """(pool, mapping attribute, whether the mapping lies, the honest layer ids): a linear wrapper whose
    full_attention_layer_id_mapping is a lying dict subclass, changes between reads, or is an honest Mapping."""
    n = draw(st.integers(3, 6))
    order = draw(st.permutations(list(range(n))))
    cut = draw(st.integers(2, n - 1))  # two attention layers at least: a swap is a different labelling
    full, other = sorted(order[:cut]), sorted(order[cut:])
    honest = {g: i for i, g in enumerate(full)}
    attr = "full_attention_layer_id_mapping"
    how = draw(st.sampled_from(["iter-lies", "alternating", "userdict", "proxy", "copy-per-read"]))
    parts = {"full_kv_pool": _mha(full, claim=False), "mamba_pool": _mamba(other)}
    if how == "alternating":
        swapped = dict(zip(honest, list(honest.values())[::-1]))
        pool: Any = _Alternating(attr, honest, swapped)
        pool.__dict__.update(parts)
        return pool, attr, True, tuple(full)
    if how == "copy-per-read":  # a fresh dict of the same objects on every read: one reading
        pool = _Alternating(attr, honest, dict(honest))
        pool.__dict__.update(parts)
        return pool, attr, False, tuple(full)
    from collections import UserDict
    from types import MappingProxyType

    mapping = {"iter-lies": _IterLies, "userdict": UserDict, "proxy": MappingProxyType}[how](honest)
    return SimpleNamespace(**parts, **{attr: mapping}), attr, how == "iter-lies", tuple(full)


@st.composite
def linear_wrappers_without_attention_ids(draw: st.DrawFn) -> tuple[Any, list[int], list[int]]:
    """(pool, attention ids, Mamba ids): a linear wrapper with no id mapping and a child without
    model_layer_ids, so nothing says where its attention layers sit; the Mamba ids include 0."""
    n = draw(st.integers(3, 6))
    order = draw(st.permutations(list(range(n))))
    cut = draw(st.integers(1, n - 1))
    full, mamba = sorted(order[:cut]), sorted(order[cut:])
    if 0 not in mamba:  # labels 0..k-1 (the child's default) then name a Mamba layer
        full, mamba = sorted(set(full) - {0} | {mamba[0]}), sorted(set(mamba) - {mamba[0]} | {0})
    pool = SimpleNamespace(full_kv_pool=_mha(full, claim=False), mamba_pool=_mamba(mamba))
    return pool, full, mamba
