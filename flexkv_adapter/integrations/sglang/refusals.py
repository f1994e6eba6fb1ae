"""What SGLang with FlexKV cannot serve correctly, refused at engine start: pools FlexKV's own connector would
overrun, and every server option the feature table refuses (:data:`~flexkv_adapter.model.sglang_features.SGLANG`)."""

from __future__ import annotations

import types
from typing import Any

import torch

from ...errors import AdapterError, UnsupportedFeatureError
from ...model.sglang_features import OPTION, SGLANG
from .checks import resolved

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


def own_connector_refusal(pool: Any) -> AdapterError | None:
    """DSA/NSA indexer pools: FlexKV's own connector registers the indexer with a whole page per token block
    and overruns the buffer (also below a view or a hybrid wrapper)."""
    for candidate in _pools(pool):
        if _indexer(candidate) is not None:
            return AdapterError(
                f"{type(candidate).__name__} has a DSA/NSA indexer ({INDEXER}); FlexKV's own SGLang connector "
                f"registers it with head_size = a whole page row per token block and would copy past the end "
                f"of the buffer, overwriting the following pages. Serve this model without --enable-flexkv"
            )
    return None


def option_refusal(server_args: Any) -> AdapterError | None:
    """The first server option the feature table refuses that ``server_args`` turns on: the one place options are
    refused, on every connector path (the bridge, FlexKV's own connector, the in-tree one)."""
    args = resolved(server_args)
    if (found := SGLANG.refused_and_on(OPTION, lambda setting: getattr(args, setting, None))) is None:
        return None
    row, setting, value, _ = found
    return UnsupportedFeatureError(f"{setting}={value!r}: {SGLANG.refusal(row.name, OPTION)}")


def start_refusal(kvcache: Any, server_args: Any) -> AdapterError | None:
    """Everything refused at engine start with FlexKV's own connector (bridged or not): the pool it would
    overrun, then every server option the feature table refuses."""
    return own_connector_refusal(kvcache) or option_refusal(server_args)
