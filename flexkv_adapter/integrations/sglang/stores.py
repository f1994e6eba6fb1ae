"""One FlexKV key per store, and one SGLang lock per store, even when a request id comes back.

SGLang 0.5.23 lets a finished request's rid be used again at attempt 0 (tokenizer_manager.py:3833-3837).
While the first request's store still runs, both stores would share FlexKV's key (``_inflight_stores[rid]``,
connector.py:1180) and SGLang's ``_inflight_store_nodes[handle]`` (flexkv_radix_cache.py:440-441): the first
node stays locked for the life of the server. :class:`StoreKeys` gives a store whose handle already has a
store in flight a key of its own, and moves SGLang's entry of the earlier store to a handle of its own, so
each completion unlocks its own node.

A key depends only on the sequence of ``store_kv`` calls and of completions (FlexKV scatters the leader's
completed keys to every rank, connector.py:1219-1223), both the same on every TP rank (FlexKV compares store
keys across ranks, connector.py:1146).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoreKeys:
    """FlexKV key -> the SGLang handle its completion reports, for every store in flight; per handle, the key of
    its latest store, the one whose node SGLang's entry under the handle itself locks.

    The tables are keyed by strings (a handle's own key, injective, :func:`.resolve.handle_key`): a
    string's hash is cached, while SGLang's frozen-dataclass handle hashes in Python on every lookup. A store of
    a handle with no other store in flight (nearly all) costs two dict entries and no list.
    """

    reports: dict[str, Any] = field(default_factory=dict)  # key -> the handle its completion reports
    latest: dict[str, str] = field(default_factory=dict)  # a handle's own key -> its latest store's key
    bases: dict[str, str] = field(default_factory=dict)  # a suffixed key -> its handle's own key
    count: int = 0

    def key(self, base: str) -> str:
        """``base`` (the handle's own key) unless a store under it is in flight, else ``base#store<n>`` (``n``
        counts the stores given a key of their own). The bridge asks only when ``base`` is in :attr:`reports`,
        and records a store whose key is ``base`` and that has no earlier one in flight itself, as
        :meth:`started` would (two entries)."""
        if base not in self.reports:
            return base
        self.count += 1
        return f"{base}#store{self.count}"

    def started(self, handle: Any, key: str, radix: Any, base: str) -> None:
        """A store FlexKV tracks: an earlier store of an equal handle keeps its SGLang lock under its own handle."""
        earlier = self.latest.get(base)
        if earlier is not None and radix is not None:  # SGLang's entry under the handle locks earlier's node
            shadow = type(handle)(rid=f"{handle.rid}\x00{earlier}", attempt_id=handle.attempt_id)
            with radix._node_lock:
                node = radix._inflight_store_nodes.pop(handle, None)
                if node is not None:
                    radix._inflight_store_nodes[shadow] = node
            self.reports[earlier] = shadow
        self.latest[base] = key
        self.reports[key] = handle
        if key != base:
            self.bases[key] = base

    def completed(self, key: str) -> Any:
        """The handle SGLang unlocks for ``key`` (None for a key this table never saw)."""
        return self.take([key])[0]

    def take(self, keys: list[str]) -> list[Any]:
        """The handle SGLang unlocks for each key, in order (None for a key this table never saw): one call per
        poll, not one per store."""
        reports, latest, bases = self.reports, self.latest, self.bases
        handles = []
        for key in keys:
            handles.append(reports.pop(key, None))
            base = bases.pop(key, key) if bases else key
            if latest.get(base) == key:
                del latest[base]
        return handles

    def __len__(self) -> int:
        """Stores in flight."""
        return len(self.reports)

    def clear(self) -> None:
        self.reports.clear()
        self.latest.clear()
        self.bases.clear()


__all__ = ["StoreKeys"]
