"""One FlexKV key per store, and one SGLang lock per store, even when a request id comes back.

SGLang 0.5.23 lets a finished request's rid be used again at attempt 0 (tokenizer_manager.py:3833-3837).
While the first request's store still runs, both stores would share FlexKV's key (``_inflight_stores[rid]``,
connector.py:1180) and SGLang's ``_inflight_store_nodes[handle]`` (flexkv_radix_cache.py:440-441): the first
node stays locked for the life of the server. :class:`StoreKeys` gives a store whose handle already has a
store in flight a key of its own, and moves SGLang's entry of the earlier store to a handle of its own, so
each completion unlocks its own node.

A key depends only on the sequence of ``store_kv`` calls, which is the same on every TP rank (FlexKV
compares store keys across ranks, connector.py:1146).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoreKeys:
    """FlexKV key -> the SGLang handle its completion reports; per handle, its stores in flight (oldest first).

    The tables are keyed by strings (a handle's own key, injective, :func:`.sglang_resolve.handle_key`): a
    string's hash is cached, while SGLang's frozen-dataclass handle hashes in Python on every lookup.
    """

    reports: dict[str, Any] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # key -> its handle's own key
    by_handle: dict[str, list[str]] = field(default_factory=dict)  # a handle's own key -> its stores' keys
    count: int = 0

    def key(self, base: str) -> str:
        """``base`` (the handle's own key) for the only store of a handle, else ``base#store<n>``."""
        self.count += 1
        return base if base not in self.by_handle else f"{base}#store{self.count}"

    def started(self, handle: Any, key: str, radix: Any, base: str) -> None:
        """A store FlexKV tracks: an earlier store of an equal handle keeps its SGLang lock under its own handle."""
        earlier = self.by_handle.get(base)
        if earlier is None:
            self.by_handle[base] = [key]
        else:
            if radix is not None:
                shadow = type(handle)(rid=f"{handle.rid}\x00{earlier[-1]}", attempt_id=handle.attempt_id)
                with radix._node_lock:
                    node = radix._inflight_store_nodes.pop(handle, None)
                    if node is not None:
                        radix._inflight_store_nodes[shadow] = node
                self.reports[earlier[-1]] = shadow
            earlier.append(key)
        self.reports[key] = handle
        self.owner[key] = base

    def completed(self, key: str) -> Any:
        """The handle SGLang unlocks for ``key`` (None for a key this table never saw)."""
        handle, base = self.reports.pop(key, None), self.owner.pop(key, None)
        if base is not None and key in (keys := self.by_handle.get(base, [])):
            keys.remove(key)
            if not keys:
                del self.by_handle[base]
        return handle

    def clear(self) -> None:
        self.reports.clear()
        self.owner.clear()
        self.by_handle.clear()


__all__ = ["StoreKeys"]
