"""What FlexKV's own SGLang connector cannot serve correctly, bridged or built directly: refuse it first."""

from __future__ import annotations

import types
from typing import Any

import torch

from ...errors import AdapterError, UnsupportedFeatureError
from ...model.sglang_features import OPTION, SGLANG

INDEXER = "index_k_with_scale_buffer"


def _own(obj: Any) -> dict[str, Any]:
    """Instance attributes, read without ``__getattr__`` (a view forwards unknown names; it may raise)."""
    try:
        found = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return {}
    return found if isinstance(found, dict) else {}


def _pools(pool: Any, depth: int = 3) -> list[Any]:
    """``pool`` and the objects below it, ``depth`` levels of instance attributes: a view's source, a
    hybrid's full pool, a user's wrapper holding the pool under any name."""
    found: list[Any] = []
    level = [pool]
    for _ in range(depth + 1):
        below: list[Any] = []
        for candidate in level:
            skip = isinstance(candidate, (torch.Tensor, type, types.ModuleType)) or candidate is None
            if skip or len(found) >= 256 or any(candidate is f for f in found):
                continue
            found.append(candidate)
            below += list(_own(candidate).values())
        level = below
    return found


def _indexer(candidate: Any) -> Any:
    """What FlexKV would read (``getattr(kvcache, INDEXER, None)``) if ``candidate`` reached it."""
    try:
        return getattr(candidate, INDEXER, None)
    except Exception:  # an object below the pool whose attribute lookup fails is not a DSA pool
        return None


def own_connector_refusal(pool: Any, server_args: Any) -> AdapterError | None:
    """DSA/NSA indexer pools (FlexKV registers the indexer with a whole page per token block and overruns
    the buffer) and decode context parallelism (each rank holds part of every page: unproven)."""
    for candidate in _pools(pool):
        if _indexer(candidate) is not None:
            return AdapterError(
                f"{type(candidate).__name__} has a DSA/NSA indexer ({INDEXER}); FlexKV's own SGLang connector "
                f"registers it with head_size = a whole page row per token block and would copy past the end "
                f"of the buffer, overwriting the following pages. Serve this model without --enable-flexkv"
            )
    dcp = getattr(server_args, "dcp_size", 1)
    if isinstance(dcp, int) and not isinstance(dcp, bool) and dcp > 1:
        return AdapterError(
            f"decode context parallelism (dcp_size={dcp}) splits every page across ranks; FlexKV's SGLang "
            f"connector keys and copies whole pages per rank, which is unproven. Run with dcp_size=1"
        )
    return None


def bridge_topology_refusal(server_args: Any) -> AdapterError | None:
    """Topologies the bridge has not been proven at: pipeline or attention context parallelism, KV-cache
    sharding, and any data parallelism, where SGLang 0.5.23's FlexKV factory passes ``dp_rank=None``
    (every DP rank would register with FlexKV as DP client 0)."""

    def size(name: str) -> int:
        value = getattr(server_args, name, 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    if size("pp_size") > 1 or size("attn_cp_size") > 1:
        return AdapterError(
            f"pp_size={size('pp_size')}, attn_cp_size={size('attn_cp_size')}: serving FlexKVRadixCache through "
            f"FlexKV's own connector is proven at tensor parallelism only (TP 1 and 2); run with pp_size=1 and "
            f"attn_cp_size=1"
        )
    # SGLang 0.5.23 spells DP attention attn_dp_size (``--dp-size N --enable-dp-attention`` resolves to
    # attn_dp_size=N, dp_size=1, enable_dp_attention=False: arg_groups/parallel_hook.py:39-61).
    dp, attn_dp = size("dp_size"), size("attn_dp_size")
    if dp > 1 or attn_dp > 1:
        return AdapterError(
            f"DP attention or data parallelism (dp_size={dp}, attn_dp_size={attn_dp}): SGLang 0.5.23's FlexKV "
            f"radix-cache factory passes dp_rank=None, so every DP rank would register with FlexKV as DP client 0; "
            f"run with dp_size=1 and attn_dp_size=1"
        )
    if getattr(server_args, "enable_kv_cache_sharding", False) is True:
        return AdapterError(
            "enable_kv_cache_sharding shards the KV pages across ranks (as decode context parallelism does); "
            "FlexKV's SGLang connector keys and copies whole pages per rank, which is unproven. Run without it"
        )
    return None


def hicache_storage_refusal(server_args: Any) -> AdapterError | None:
    """A HiCache storage backend next to FlexKV: SGLang 0.5.23's scheduler then fails at the first request.

    With one set, ``Scheduler._prefetch_kvcache`` calls ``tree_cache.is_backuped`` (managers/scheduler.py:3365),
    which FlexKVRadixCache lacks, then ``prefetch_from_storage`` with nine arguments where it takes three."""
    backend = getattr(server_args, "hicache_storage_backend", None)
    if backend is None or backend == "":
        return None
    return AdapterError(
        f"hicache_storage_backend={backend!r}: SGLang 0.5.23's scheduler then calls FlexKVRadixCache.is_backuped "
        f"(which it lacks) at every admitted request; FlexKV's own SSD / remote tiers are configured in FlexKV "
        f"instead. Run without --hicache-storage-backend"
    )


def _on(value: Any, example: Any) -> bool:
    """Whether a server setting turns its feature on, judged by the kind of value that does (the row's example):
    a flag set, a size above 1, a name given."""
    if isinstance(example, bool):
        return value is True
    if isinstance(example, int):
        return isinstance(value, int) and not isinstance(value, bool) and value > 1
    return isinstance(value, str) and value != ""


def option_refusal(server_args: Any) -> AdapterError | None:
    """The first server option the feature table refuses that ``server_args`` turns on (default deny's side for
    options: every refused row is checked here, also those a specific refusal above words first)."""
    for row in SGLANG.of_kind(OPTION):
        if row.verdict != "refused" or not row.trigger:
            continue
        setting, example = row.trigger
        value = getattr(server_args, setting, None)
        if _on(value, example):
            return UnsupportedFeatureError(f"{setting}={value!r}: {SGLANG.refusal(row.name, OPTION)}")
    return None


def start_refusal(kvcache: Any, server_args: Any) -> AdapterError | None:
    """Everything the bridge refuses at engine start, in order: the pool for FlexKV's own connector, the
    topologies, a HiCache storage backend, then every option the feature table refuses."""
    return (
        own_connector_refusal(kvcache, server_args)
        or bridge_topology_refusal(server_args)
        or hicache_storage_refusal(server_args)
        or option_refusal(server_args)
    )
