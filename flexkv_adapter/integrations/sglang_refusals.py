"""What FlexKV's own SGLang connector cannot serve correctly, bridged or built directly: refuse it first."""

from __future__ import annotations

from typing import Any

from ..errors import AdapterError

INDEXER = "index_k_with_scale_buffer"
# Where a DSA/NSA pool can sit below what the connector receives: a view's source, a hybrid's children.
INNER = ("source", "full_kv_pool", "swa_kv_pool", "main_pool", "unified_kv_pool", "c4_indexer_kv_pool")


def _pools(pool: Any) -> list[Any]:
    """``pool`` and every pool below it (instance attributes only: a view forwards unknown names)."""
    found: list[Any] = []
    todo = [pool]
    while todo and len(found) < 32:
        candidate = todo.pop(0)
        if candidate is None or any(candidate is seen for seen in found):
            continue
        found.append(candidate)
        inner = getattr(candidate, "__dict__", {})
        todo += [inner.get(name) for name in INNER]
    return found


def own_connector_refusal(pool: Any, server_args: Any) -> AdapterError | None:
    """DSA/NSA indexer pools (FlexKV registers the indexer with a whole page per token block and overruns
    the buffer) and decode context parallelism (each rank holds part of every page: unproven)."""
    for candidate in _pools(pool):
        if getattr(candidate, INDEXER, None) is not None:
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
    """Topologies the bridge has not been proven at: pipeline or attention context parallelism, and
    DP attention, where SGLang 0.5.23's FlexKV factory passes ``dp_rank=None`` (every DP rank would
    register with FlexKV as DP client 0)."""

    def size(name: str) -> int:
        value = getattr(server_args, name, 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    if size("pp_size") > 1 or size("attn_cp_size") > 1:
        return AdapterError(
            f"pp_size={size('pp_size')}, attn_cp_size={size('attn_cp_size')}: serving FlexKVRadixCache through "
            f"FlexKV's own connector is proven at tensor parallelism only (TP 1 and 2); run with pp_size=1 and "
            f"attn_cp_size=1"
        )
    if getattr(server_args, "enable_dp_attention", False) and size("dp_size") > 1:
        return AdapterError(
            f"DP attention with dp_size={size('dp_size')}: SGLang 0.5.23's FlexKV radix-cache factory passes "
            f"dp_rank=None, so every DP rank would register with FlexKV as DP client 0; run without DP attention"
        )
    return None
