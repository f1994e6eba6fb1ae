"""What FlexKV's own SGLang connector cannot serve correctly, bridged or built directly: refuse it first."""

from __future__ import annotations

from typing import Any

from ..errors import AdapterError

INDEXER = "index_k_with_scale_buffer"


def own_connector_refusal(pool: Any, server_args: Any) -> AdapterError | None:
    """DSA/NSA indexer pools (FlexKV registers the indexer with a whole page per token block and overruns
    the buffer) and decode context parallelism (each rank holds part of every page: unproven)."""
    source = getattr(pool, "source", None)
    for candidate in (pool, source):
        if candidate is not None and getattr(candidate, INDEXER, None) is not None:
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
