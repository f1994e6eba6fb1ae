"""Is a dict vLLM 0.33's ``register_kv_caches`` input, and do its views read another way too?

Split from :mod:`~flexkv_adapter.readers.vllm_layout` (which re-exports these names): recognition asks the
same question of the tensors wherever they are nested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import AmbiguousLayoutError, InconsistentLayersError, UnsupportedPoolError
from ..model.copy_rules import storage_problem

INDEXER_SUFFIX = ".k_cache"  # DeepSeek-V3.2 indexer entries; FlexKV's vLLM adapter splits them off by name


def is_vllm_dict(obj: object) -> bool:
    """A dict of 4-D tensors that all view one backing buffer: vLLM 0.33's ``register_kv_caches`` input.

    Raises AmbiguousLayoutError where another per-layer reading has the same strides.
    """
    if not isinstance(obj, Mapping):
        return False
    main = [t for n, t in layer_items(obj) if not (isinstance(n, str) and n.endswith(INDEXER_SUFFIX))]
    if not main or not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in main):
        return False
    if any(storage_problem(t) for t in main) or len({t.untyped_storage().data_ptr() for t in main}) != 1:
        return False  # meta/fake/sparse tensors: the general path refuses them with the reason
    if (twin := vllm_twin(main)) is not None:
        raise AmbiguousLayoutError(f"a dict of {twin}")
    return True


def layer_items(obj: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """A layer dict's entries, read once through ``items()``, with ``str`` subclass names as plain ``str``:
    a name's ``endswith`` or ``__eq__`` may raise or lie, and the name is the characters it holds."""
    try:
        items = list(obj.items())
    except Exception as exc:  # a Mapping subclass whose items() fails
        raise UnsupportedPoolError(
            f"{type(obj).__name__} is a mapping whose items() raised {type(exc).__name__}: {str(exc)[:120]}"
        ) from None
    plain = [(str.__str__(n) if isinstance(n, str) else n, t) for n, t in items]
    names = [n for n, _ in plain if isinstance(n, str)]
    if len(set(names)) != len(names):  # two keys of the same characters (a str subclass hashes apart)
        repeated = sorted({n for n in names if names.count(n) > 1})[:3]
        raise InconsistentLayersError(
            f"{type(obj).__name__}: layer names {repeated} appear twice (keys with the same characters that hash "
            f"or compare apart); vLLM gives each layer one entry"
        )
    return plain


def vllm_twin(tensors: Sequence[torch.Tensor]) -> str | None:
    """The ambiguity, if per-layer 4-D views of one buffer also read as vLLM 0.33 ``[B, H, N, C]`` views.

    The one rule for a dict passed directly and for the same tensors nested anywhere (``pool.kv_caches``,
    a list of the dict's values): the strides are identical, so only an option can tell them apart.
    """
    if not tensors or not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in tensors):
        return None
    if any(storage_problem(t) for t in tensors) or len({t.untyped_storage().data_ptr() for t in tensors}) != 1:
        return None
    shape = tuple(tensors[0].shape)
    same_strides = [  # (fits, vLLM reading, other reading, axes that settle it)
        (shape[0] == 2, "[blocks=2, heads, tokens, C]", "per-layer [K/V=2, rows, heads, dim]", "KV N H D"),
        (shape[2] == 1 < shape[1], "[blocks, heads, tokens=1, C]", "per-layer pages [P, T, H=1, D]", "P T H D"),
    ]
    for vllm, reading, axes in (r[1:] for r in same_strides if r[0]):
        return (
            f"{shape} views of one buffer reads as vLLM 0.33 {vllm} or as {reading}. Pass axes='{axes}' "
            f"for the latter; register such a vLLM 0.33 cache with flexkv_adapter.flexkv.vllm_plan.plan_vllm"
        )
    return None
