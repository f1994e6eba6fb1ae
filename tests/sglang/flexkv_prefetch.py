"""FlexKV's own connector (34ab141) with a storage tier: the prefetch API the bridge translates.

Written from ``flexkv/integration/sglang/connector.py`` (``prefetch_async``, ``check_prefetch_progress``,
``cancel_prefetch``) and ``flexkv/kvmanager.py`` (``KVManager.prefetch_async``), no code copied:

* prefetch is on when FlexKV's config enables a tier below the CPU; here, as in FlexKV's
  ``load_user_config_from_env``, ``FLEXKV_SSD_CACHE_GB`` > 0;
* the leader asks ``KVManager.prefetch_async(token_ids=...)`` (it answers ``(task_id, tokens)``),
  scatters the task id, and every rank tracks ``rid -> task``; progress polls ``try_wait`` on the
  leader and scatters ``done``; a terminal status drops the tracking;
* ``cancel_prefetch(rid)`` drops the rid's held lookup and its prefetch tracking *without* cancelling
  either task in the KVManager (FlexKV cannot cancel a prefetch; SGLang calls ``release_pending``
  first on an abort).

:class:`TieredKVManager` adds the tier to the CPU data plane: :meth:`TieredKVManager.demote` moves the
CPU pages down (what CPU eviction leaves behind a write-through tier), ``get_match`` sees only CPU
pages (as with FlexKV's Mooncake store, where REMOTE2H is prefetch-only), and a prefetch's copy up
runs at its second poll, like a store's host copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .flexkv_serving import _UNSET, TERMINAL, DataKVManager, ServingFlexKVConnector, _status, _Task


@dataclass
class TieredKVManager(DataKVManager):
    """The CPU data plane plus a storage tier that only ``prefetch_async`` reads."""

    storage: dict[tuple[int, ...], list[Any]] = field(default_factory=dict)

    def demote(self) -> int:
        """Move every CPU page to the storage tier; how many moved."""
        self.storage.update(self.pages)
        moved = len(self.pages)
        self.pages.clear()
        return moved

    def prefetch_async(self, token_ids: np.ndarray, namespace: Any = None, swa_aware: bool = False) -> tuple[int, int]:
        pages = []
        for prefix in self._prefixes(token_ids):
            if prefix not in self.storage:
                break
            pages.append(prefix)
        task = _Task("prefetch", pages, [self.page] * len(pages), status="running" if pages else "success")
        return self._new(task), len(pages) * self.page

    def _run(self, task: _Task) -> None:
        if task.kind != "prefetch":
            return super()._run(task)
        for prefix in task.pages:
            self.pages[prefix] = self.storage[prefix]
        task.status = "success"


class PrefetchFlexKVConnector(ServingFlexKVConnector):
    """FlexKV's own connector with its prefetch API live (a tier below the CPU configured)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._sync_ctx.is_sync_leader:
            self.kv_manager = TieredKVManager(self.kv_manager.model_config, self.kv_manager.cache_config)
        self._prefetch_enabled = int(os.environ.get("FLEXKV_SSD_CACHE_GB", "0")) > 0
        self._ongoing_prefetches: dict[str, int] = {}

    def prefetch_async(self, rid, token_ids, sglang_req_id=_UNSET):
        if not self._prefetch_enabled or not rid:
            return -1
        tid = -1
        if self._sync_ctx.is_sync_leader:
            answer = self.kv_manager.prefetch_async(token_ids=np.asarray(token_ids, dtype=np.int64))
            tid = answer[0] if isinstance(answer, tuple) else answer
        if self._sync_ctx.needs_sync:
            tid = self._sync_ctx.scatter({"task_id": tid}, channel="prefetch_start")["task_id"]
        if tid >= 0:
            self._ongoing_prefetches[rid] = tid
        return tid

    def check_prefetch_progress(self, rid):
        if not self._prefetch_enabled:
            return True
        tid = self._ongoing_prefetches.get(rid, -1)
        if tid < 0:
            return True
        done = False
        if self._sync_ctx.is_sync_leader:
            done = _status(self.kv_manager.try_wait(task_ids=[tid]).get(tid)) in TERMINAL
        if self._sync_ctx.needs_sync:
            done = self._sync_ctx.scatter({"done": done}, channel="prefetch_progress")["done"]
        if done:
            self._ongoing_prefetches.pop(rid, None)
        return done

    def cancel_prefetch(self, rid):
        self._pending_lookups.pop(rid, None)
        self._ongoing_prefetches.pop(rid, None)
