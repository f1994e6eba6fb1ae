"""DeepSeek-V3.2 indexer entries of a vLLM cache dict, checked against what FlexKV 34ab141 does with them.

FlexKV's own ``register_to_server`` (``vllm_v1_adapter.py:826-957``) splits every ``.k_cache`` entry off the
dict by name and registers them as a second layer group whose layout it reads off the *first* entry alone:
LAYERFIRST, one head, ``num_block = shape[0]``, ``tokens_per_block = shape[1]``, ``head_size = shape[2]``,
``compress_ratio = block_size // shape[1]``, addressed with the main KV's block ids. Its workers then read
block ``b`` of an entry at ``data_ptr + b * shape[1] * shape[2] * itemsize`` (strides ignored). So each entry
must be exactly that arithmetic, or FlexKV stores and restores other bytes without a word. The vLLM plugin
is the one path that hands these entries to FlexKV (``plan()`` refuses them): it takes them by FlexKV's own rule
(:func:`indexer_entries`) and calls :func:`check_indexer` on them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import InconsistentLayersError, NotAddressableError, describe
from ..gate import Group, admit
from ..readers.containers import layer_index_from_name

FLEXKV_INDEXER_MARK = ".k_cache"  # FlexKV's split: an entry whose name contains it (vllm_v1_adapter.py:830)


def indexer_entries(kv_caches: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries FlexKV's split takes as indexer caches, each in the form FlexKV 34ab141 reads: vLLM 0.33 hands
    a ``[B, 1, N, C]`` view per layer (``allocate_kv_cache``; only the layer's own copy is squeezed, in
    ``DeepseekV32IndexerCache.bind_kv_cache``), and FlexKV asserts a 3-D ``[B, N, C]`` (:911): the one-head
    view is squeezed here (the same memory, no copy). Anything else is passed as it is, for :func:`check_indexer`."""
    return {n: _squeezed(t) for n, t in kv_caches.items() if isinstance(n, str) and FLEXKV_INDEXER_MARK in n}


def _squeezed(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(1) if isinstance(t, torch.Tensor) and t.ndim == 4 and t.shape[1] == 1 else t


def check_indexer(
    entries: Mapping[str, torch.Tensor],
    *,
    num_block: int,
    tokens_per_block: int,
    main: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Refuse indexer entries FlexKV would misread; ``num_block``/``tokens_per_block``: the main KV's plan, and
    ``main`` its entries (name -> tensor, in the dict's order), which FlexKV registers beside them."""
    if not entries:
        return
    where = "vLLM indexer caches (FlexKV registers them as its second layer group)"
    tensors = tuple(entries.values())
    if bad := next((n for n, t in entries.items() if not isinstance(t, torch.Tensor)), None):
        raise NotAddressableError(f"{where}: {bad} is {type(entries[bad]).__name__}, not a tensor")
    groups = [Group("indexer", tensors, None, 1)]
    if main is not None:
        _check_layers(where, list(entries), list(main))
        groups.insert(0, Group("KV", tuple(main.values()), None, 1))
    admit(where, groups)  # memory, a row, no byte shared between two entries, nor between an entry and the KV
    first_name, first = next(iter(entries.items()))
    if first.ndim != 3:
        raise NotAddressableError(
            f"{where}: {first_name} is {describe(first)}; FlexKV reads a 3-D [blocks, tokens, bytes] cache"
        )
    for name, t in entries.items():  # FlexKV's layout is the first entry's: every other one must match it
        if (t.shape, t.dtype, t.device) != (first.shape, first.dtype, first.device):
            raise InconsistentLayersError(
                f"{where}: {name} ({describe(t)}) differs from {first_name} ({describe(first)}); FlexKV lays "
                f"every entry out as the first"
            )
        if not t.is_contiguous():
            raise NotAddressableError(
                f"{where}: {name} ({describe(t)}) is not contiguous; FlexKV reads block b at "
                f"data_ptr + b x {first.shape[1]} x {first.shape[2]} elements, so it would copy other bytes"
            )
    blocks, tokens = int(first.shape[0]), int(first.shape[1])
    if blocks < num_block:
        raise NotAddressableError(
            f"{where}: {first_name} has {blocks} blocks, but FlexKV addresses it with the main KV cache's block "
            f"ids (up to {num_block - 1}): it would read past its end"
        )
    if tokens > tokens_per_block or tokens_per_block % tokens:
        raise NotAddressableError(
            f"{where}: {first_name} has {tokens}-token blocks; FlexKV's compress ratio is "
            f"{tokens_per_block} // {tokens} (the main KV's block over the indexer's), which must divide exactly"
        )


def _check_layers(where: str, indexer: list[str], main: list[str]) -> None:
    """FlexKV gives the indexer entry i the layer index i (``layer_indices=range(len(indexer))``, :936-944) and
    the main KV entry i the same: one entry per main layer, in the main layers' order, or it restores one layer's
    indexer into another's (or none at all)."""
    if len(indexer) != len(main):
        raise InconsistentLayersError(
            f"{where}: {len(indexer)} indexer entries for {len(main)} KV layers; FlexKV registers indexer entry i "
            f"as layer i, so every layer needs its own, in the KV's order"
        )
    ours, kv = [layer_index_from_name(n) for n in indexer], [layer_index_from_name(n) for n in main]
    if None in ours or None in kv or ours != kv or len(set(ours)) != len(ours):
        raise InconsistentLayersError(
            f"{where}: the indexer entries' layers {ours} are not the KV entries' {kv}, one each, in order (read "
            f"from their names: one integer component each, None where a name has none or several); FlexKV pairs "
            f"them by position"
        )


__all__ = ["FLEXKV_INDEXER_MARK", "check_indexer", "indexer_entries"]
