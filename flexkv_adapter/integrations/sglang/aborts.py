"""An aborted request keeps its radix lock while FlexKV still copies its slots.

SGLang 0.5.23's PD prefill ``handle_inflight_transfer_failure`` (disaggregation/prefill.py:1305-1306)
checkpoints a finished request, which starts FlexKV's store of its slots and locks the radix node until
the store completes (storage/flexkv/flexkv_radix_cache.py:422-441), then aborts it.
``FlexKVRadixCache.release_aborted_request`` (:481-489) drops that lock at once: the slots can be evicted
and given to another request while FlexKV's host copy still reads them, and FlexKV then serves the
other request's KV under this prefix. The hook leaves the in-flight store tracked, so the regular
completion poll (``_drain_completed_stores``, :467-475; FlexKV reports every store it started) unlocks
the node, as for a request that was not aborted.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from ...errors import AdapterError

# What the hook reads; FlexKVRadixCache.__init__ must set both (the bridge refuses to serve otherwise).
STORE_LOCKS = ("_inflight_store_nodes", "_node_lock")
RELEASE_ABORTED = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache.FlexKVRadixCache.release_aborted_request"


def release_aborted_request(original: Any, self: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
    """SGLang's abort cleanup (held lookup, prefetch, load marker), but not the lock of a store still copying."""
    nodes, lock = (getattr(self, name, None) for name in STORE_LOCKS)  # type: Any, Any
    if not isinstance(nodes, MutableMapping) or not hasattr(lock, "__enter__"):  # never SGLang's release instead
        raise AdapterError(
            f"flexkv_adapter (SGLang plugin): {type(self).__name__}.{STORE_LOCKS[0]} is {type(nodes).__name__}, "
            f"{STORE_LOCKS[1]} {type(lock).__name__}: the abort hook cannot keep an in-flight FlexKV store's slots "
            "locked, and releasing them would let FlexKV store another request's bytes under this prefix"
        )
    with lock:
        node = nodes.pop(handle, None)
    try:
        return original(self, handle, *args, **kwargs)
    finally:
        if node is not None:
            with lock:
                nodes[handle] = node


def register_abort_hook(registry: Any, hook_type: Any) -> list[str]:
    registry.register(RELEASE_ABORTED, release_aborted_request, hook_type.AROUND)
    return [f"{RELEASE_ABORTED} (an aborted request's in-flight FlexKV store keeps its slots)"]
