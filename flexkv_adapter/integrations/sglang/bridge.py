"""SGLang 0.5.23's FlexKVRadixCache served by FlexKV's own connector (``flexkv.integration.sglang.connector``).

SGLang's in-tree connector cannot register with current FlexKV, and FlexKV's own connector takes a string ``rid``
where the radix cache passes a ``CacheRequestHandle``. :class:`BridgeConnector` is what the radix cache builds
instead of the in-tree class: it owns FlexKV's connector and passes ``rid=<key of the handle>``. The key keeps
``attempt_id`` (disaggregated-prefill retries reuse ``rid``), is the same on every rank (FlexKV compares store
keys across TP ranks) and is unique per store in flight (:mod:`.stores`).

Every FlexKV outcome passes through here: a load is "every slot on every rank" or a miss (:mod:`.outcomes`),
slots FlexKV may still write stay quarantined, nothing FlexKV raises reaches SGLang's scheduler (the error is
logged once, its FlexKV task cancelled, the call a miss), and a flush empties FlexKV or fails (:mod:`.flush`).
Which connector is built, and the checks before: :mod:`.resolve`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from ...config.settings import load_settings
from ...errors import AdapterError
from .flush import SCHEDULER_MODULE, flush, register_radix_hooks
from .hits_log import attach as attach_hits_log
from .outcomes import QUARANTINE, Agreement, Quarantine, Seen, load_outcome, status_of, waited
from .recorder import BARRIER, WAITED, ObservedManager, observe_barrier
from .refusals import start_refusal
from .resolve import (
    CALLS,
    FLEXKV_CONNECTOR_MODULE,
    HANDLE_MODULE,
    PREFIX,
    ConnectorShape,
    check_connector,
    handle_key,
    hooked_by,
    missing_radix_hooks,
    resolve_connector,
)
from .stores import StoreKeys
from .unlaunched import cancel_unlaunched

logger = logging.getLogger(__name__)
FLUSH_MODULE = register_radix_hooks.__module__  # the module whose hook wraps Scheduler.flush_cache


class BridgeConnector:
    """SGLang's FlexKVRadixCache calls (``handle=``) translated to FlexKV's connector (``rid=``)."""

    stale = False  # a flush did not empty FlexKV: bypass it until one does
    carries_namespaces = True  # its recorder hands a request's namespace to FlexKV (.namespaces)
    radix: Any = None  # the FlexKVRadixCache (attached by the plugin's hook on its __init__)
    # the last handle a lookup, load or store was given, and its key: SGLang passes a request's own handle
    # (Req.cache_request_handle, a frozen dataclass) to each of its calls, so the key is made once a request
    _memo_handle: Any = None
    _memo_key, _tp1_leader = "", False
    _success: Any = None  # the last status object a load's wait answered that status_of reads as "success"

    def __init__(self, **kwargs: Any) -> None:
        try:
            # Also here, not only in the hook on FlexKV's __init__: SGLang logs a hook it fails to apply and serves on.
            args = kwargs.get("server_args")
            if refusal := start_refusal(kwargs.get("kvcache"), args):
                raise refusal
            if missing := missing_radix_hooks():
                raise AdapterError(
                    f"the plugin's hook(s) on {'; '.join(missing)} are not applied (see SGLang's 'Failed to apply "
                    f"hooks' log)"
                )
            shape, why = resolve_connector()
            wait_s = load_settings().reset_wait_s
        except AdapterError as exc:
            raise AdapterError(f"{PREFIX}, choosing the connector for FlexKVRadixCache: {exc}") from exc
        logger.info(
            "%s: FlexKVRadixCache is served by FlexKV's own connector (%s) through the handle bridge, because "
            "SGLang's in-tree connector does not match the installed FlexKV: %s",
            PREFIX, FLEXKV_CONNECTOR_MODULE, why,
        )  # fmt: skip
        # whether FlexKV's method also takes SGLang's rid (for its logs): plain flags, read per call on the hot path
        takes = shape.takes_req_id
        self._lookup_logs_rid, self._store_logs_rid = "lookup_kv" in takes, "store_kv" in takes
        self._prefetch_logs_rid = "prefetch_async" in takes
        self._handle_type: Any = None  # SGLang's CacheRequestHandle, seen on the first call
        self.connector = shape.cls(**kwargs)
        sync = getattr(self.connector, "_sync_ctx", None)
        self.leader = bool(getattr(sync, "is_sync_leader", True))
        self.agreement = Agreement(kwargs.get("attn_tp_group"), bool(getattr(sync, "needs_sync", False)))
        self._tp1_leader = self.leader and not self.agreement.active  # a load's outcome read inline (retrieve_kv)
        manager = getattr(self.connector, "kv_manager", None)
        self.observed = ObservedManager(manager) if manager is not None else None
        if self.observed is not None:
            self.connector.kv_manager = self.observed  # logs what each call did; changes nothing
        # this call's log of FlexKV's KVManager calls (the leader's; stays empty elsewhere): cleared, with _clean,
        # as each call that may reach FlexKV starts (inline: a method per call costs a frame on every request)
        self._log: list[tuple[str, Any]] = self.observed.log if self.observed is not None else []
        if self.agreement.active:
            observe_barrier(sync, self._log)
        self.quarantine = Quarantine(self.agreement)
        self.stores = StoreKeys()
        self._wait_s, self._clean = wait_s, False
        attach_hits_log(self)  # the rate-limited INFO line of FlexKV's hits and restored blocks

    @property
    def enable_layerwise(self) -> bool:
        return bool(self.connector.enable_layerwise)

    @property
    def manager(self) -> Any:
        """FlexKV's KVManager itself (leader only; None elsewhere)."""
        return self.observed.manager if self.observed is not None else getattr(self.connector, "kv_manager", None)

    def attach(self, radix: Any) -> None:
        self.radix = radix
        self.quarantine.attach(radix.token_to_kv_pool_allocator)

    def _cancel(self, task_ids: list[int]) -> None:
        """Cancel FlexKV tasks an error left behind before their launch returned (they hold FlexKV's CPU radix nodes
        and staging blocks); one FlexKV marked running before its launch raised is rolled back (:mod:`.unlaunched`)."""
        if task_ids and self.leader and self.manager is not None:
            try:
                cancel_unlaunched(self.manager, task_ids)
            except Exception as exc:
                logger.warning("%s: cancelling FlexKV task(s) %s failed too: %s", PREFIX, task_ids, exc)

    def _failed(self, what: str, key: Any, exc: BaseException | str, outcome: str) -> None:
        logger.warning("%s: FlexKV's %s for %r failed (%s); %s", PREFIX, what, key,
                       exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}", outcome)  # fmt: skip

    def lookup_kv(self, token_ids: Any, token_mask: Any, handle: Any = None) -> Any:
        if self.stale:
            return -1, 0
        key = None if handle is None else handle_key(handle)  # a request's first call: made here, kept for the next
        if key is not None:
            self._memo_handle, self._memo_key = handle, key
        self._clean = False
        self._log.clear()
        try:
            if self._lookup_logs_rid and handle is not None:
                result = self.connector.lookup_kv(
                    token_ids=token_ids, token_mask=token_mask, rid=key, sglang_req_id=handle.rid
                )
            else:
                result = self.connector.lookup_kv(token_ids=token_ids, token_mask=token_mask, rid=key)
        except Exception as exc:
            self._cancel(Seen(self._log).created)
            self._failed("lookup", key, exc, "served as a miss")
            return self._agreed_lookup(handle, key, (-1, 0), failed=True)
        return self._agreed_lookup(handle, key, result, failed=False) if self.agreement.active else result

    def _agreed_lookup(self, handle: Any, key: str | None, result: Any, failed: bool) -> Any:
        """One answer on every rank: a rank that raised after FlexKV's scatter left the others with a hit, whose
        retrieve would wait in a barrier this rank never enters (at TP 1 there is nothing to agree on)."""
        if self.agreement.active and self.agreement.min([int(not failed)])[0] == 0 and not failed:
            if key is not None:
                self.release_pending(handle)
            self._failed("lookup", key, "another TP rank's lookup failed", "served as a miss on every rank")
            return -1, 0
        return result

    def retrieve_kv(self, handle: Any, slot_mapping: Any) -> int:
        """Every slot on every rank, or 0; slots FlexKV may still write are quarantined (SGLang frees the rest)."""
        if handle is not self._memo_handle:
            self._memo_handle, self._memo_key = handle, handle_key(handle)
        key = self._memo_key
        count: int = slot_mapping.numel()
        pending = getattr(self.connector, "_pending_lookups", None)
        tid = -1 if pending is None else int(pending.get(key, -1))
        self._clean = False
        self._log.clear()
        try:
            returned = self.connector.retrieve_kv(key, slot_mapping)
        except Exception as exc:
            return self._settle_load(handle, key, slot_mapping, tid, None, exc)
        # the one outcome that needs no more: load_outcome's "count", at TP 1 (the rest is _settle_load's). A
        # leader's load that FlexKV's last call, its wait, answered "success" for is read inline, as load_outcome
        # reads it (waited, status_of: the last wait that answered for the task); anything else, by load_outcome
        if type(returned) is int and returned == count > 0:
            log = self._log
            last = log[-1][1] if self._tp1_leader and log and log[-1][0] == WAITED else None
            if last and tid in last:
                status = getattr(last[tid], "status", None)  # FlexKV's enum member: its .value is a property
                if status is not None and (status is self._success or status_of(last[tid]) == "success"):
                    self._success = status
                    return count
            if not self.agreement.active and load_outcome(self.leader, log, tid, count, returned, False) == count:
                return count
        return self._settle_load(handle, key, slot_mapping, tid, returned, None)

    def _settle_load(self, handle: Any, key: str, slot_mapping: Any, tid: int, returned: Any,
                     error: Exception | None) -> int:  # fmt: skip
        """The load's agreed outcome (see :func:`.outcomes.load_outcome`): all, a miss or quarantined."""
        count, log = int(slot_mapping.numel()), self._log
        if error is None:
            try:
                returned = int(returned)
            except Exception as exc:  # not a count: as if FlexKV's call had raised
                returned, error = None, exc
        if error is not None and self._skipped_barrier(log):
            self.connector._sync_ctx.barrier()
        local = load_outcome(self.leader, log, tid, count, returned, error is not None)
        if local == 0 and tid >= 0 and tid not in Seen(log).launched:
            self._cancel([tid])  # never launched (launch raised): the get task still holds FlexKV's match
        agreed = self.agreement.min([local])[0] if self.agreement.active else local
        if agreed == count > 0:
            return count
        if agreed == QUARANTINE:
            self.quarantine.add(tid if self.leader else -1, slot_mapping)
        if local != count:
            why = error or f"task {tid}: {waited(log, tid, 'not launched')}, {returned} of {count} slots"
            outcome = "quarantined until FlexKV's copy ends" if agreed == QUARANTINE else "its slots are freed"
            self._failed("load", key, why, f"served as a miss; {outcome}")
        return 0

    def _skipped_barrier(self, log: list[tuple[str, Any]]) -> bool:
        """Whether FlexKV's raising ``retrieve_kv`` left its TP barrier (connector.py:692-693) unentered on this rank,
        leader (launch, wait) or not (e.g. its slot mapping's copy to the host): the other ranks wait in it."""
        return self.agreement.active and all(what != BARRIER for what, _ in log)

    def start_load_kv_layerwise(self, handle: Any, slot_mapping: Any) -> Any:
        return self.connector.start_load_kv_layerwise(handle_key(handle), slot_mapping)

    def holds_lookup(self, handle: Any) -> bool:
        """Whether FlexKV's connector holds a lookup (its get task) for ``handle`` (see :mod:`.lookups`)."""
        pending = getattr(self.connector, "_pending_lookups", None)  # None: unknown, release (FlexKV's is idempotent)
        key = self._memo_key if handle is self._memo_handle else handle_key(handle)  # a miss's lookup just made it
        return pending is None or key in pending

    def release_pending(self, handle: Any) -> None:
        try:
            self.connector.release_pending(handle_key(handle))
        except Exception as exc:
            self._failed("release of a held lookup", handle_key(handle), exc, "ignored")

    def store_kv(self, handle: Any, token_ids: Any, kv_indices: Any) -> Any:
        """FlexKV's task id, or -1 (nothing stored: SGLang unlocks the node); a failed launch's put is cancelled."""
        if self.stale:
            return -1
        self._handle_type = type(handle)  # SGLang's handle type, for the completions it reports (_handle)
        if handle is not self._memo_handle:
            self._memo_handle, self._memo_key = handle, handle_key(handle)
        base, stores = self._memo_key, self.stores
        key = base if base not in stores.reports else stores.key(base)
        self._clean = False
        self._log.clear()
        try:
            if self._store_logs_rid:
                tid = int(self.connector.store_kv(rid=key, token_ids=token_ids, kv_indices=kv_indices,
                                                  sglang_req_id=handle.rid))  # fmt: skip
            else:
                tid = int(self.connector.store_kv(rid=key, token_ids=token_ids, kv_indices=kv_indices))
        except Exception as exc:
            seen = Seen(self._log)
            self._cancel([t for t in seen.created if t not in seen.launched])
            return self._store_failed(key, exc)
        if self.agreement.active:
            self.agreement.min([1, -1])  # every rank enters the collective a failing rank enters
        if tid >= 0:
            if key == base and base not in stores.latest:  # the handle's only store in flight (nearly every one)
                stores.latest[base], stores.reports[base] = base, handle
            else:
                stores.started(handle, key, self.radix, base)
        return tid

    def _store_failed(self, key: str, error: Exception) -> int:
        """-1 where every rank failed alike (nothing stored anywhere); a store started on some ranks only raises."""
        worst, best = self.agreement.min([0, 0]) if self.agreement.active else (0, 0)
        if worst != -best:  # another rank's FlexKV tracks this store and its copy reads this rank's slots too
            raise AdapterError(f"{PREFIX}: FlexKV's store of {key!r} started on some TP ranks only: {error}") from error
        self._failed("store", key, error, "nothing stored")
        return -1

    def prefetch_async(self, handle: Any, token_ids: Any) -> Any:
        self._handle_type = type(handle)
        if self._prefetch_logs_rid:
            return self.connector.prefetch_async(handle_key(handle), token_ids, sglang_req_id=handle.rid)
        return self.connector.prefetch_async(handle_key(handle), token_ids)

    def check_prefetch_progress(self, handle: Any) -> Any:
        return self.connector.check_prefetch_progress(handle_key(handle))

    def cancel_prefetch(self, handle: Any) -> None:
        try:
            self.connector.cancel_prefetch(handle_key(handle))
        except Exception as exc:
            self._failed("prefetch cancel", handle_key(handle), exc, "ignored")

    def check_completed_stores(self) -> list[Any]:
        """FlexKV's completed keys as SGLang's handles (a collective in FlexKV: call it on every rank); quarantined
        loads whose copy ended give their slots back."""
        self._log.clear()  # every step: what FlexKV's drain, layerwise and prefetch calls log, no rule reads
        try:
            keys = self.connector.check_completed_stores()
        except Exception as exc:
            keys = self._poll_failed(exc)
        else:
            self._poll_failing = False
        if self.quarantine.held:  # the same list on every rank: all enter poll's collective or none
            self.quarantine.poll(self.manager, self.leader)
        if not keys:
            return []
        handles = self.stores.take(keys)
        if all(handles):  # every completion is a store the bridge tracks (all but after a failed poll)
            return handles
        return [handle or self._handle(key) for key, handle in zip(keys, handles, strict=True)]

    _poll_failing = False  # FlexKV's store poll raised on the last call (its error is logged once per streak)

    def _poll_failed(self, error: Exception) -> list[str]:
        """The stores FlexKV's raising poll already took off its in-flight table: complete (it pops only terminal
        ones, connector.py:1224-1241), reported so that SGLang unlocks their nodes; the rest are polled again. At TP
        above 1 the raise may be its scatter to the other ranks (connector.py:1219-1223): the ranks' in-flight
        stores may differ from then on, so it stops here, explained, rather than serve diverged trees."""
        if self.agreement.active:
            raise AdapterError(f"{PREFIX}: FlexKV's store-completion poll failed at TP > 1, where the ranks must "
                               f"agree on it: {type(error).__name__}: {error}") from error  # fmt: skip
        inflight = getattr(self.connector, "_inflight_stores", {})
        taken = [key for key in self.stores.reports if key not in inflight]
        if not self._poll_failing:
            self._failed("store-completion poll", f"{len(self.stores)} store(s) in flight", error,
                         f"{len(taken)} it had taken are reported complete, the rest polled again; logged once until "
                         "it answers")  # fmt: skip
        self._poll_failing = True
        return taken

    def _handle(self, key: str) -> Any:
        """The handle the key was made from: equal to SGLang's (a frozen dataclass of rid, attempt_id)."""
        rid, _, attempt = key.rpartition("@attempt")
        cls = self._handle_type or importlib.import_module(HANDLE_MODULE).CacheRequestHandle
        return cls(rid=rid, attempt_id=int(attempt.partition("#store")[0]))

    def flush(self) -> None:
        """Empty FlexKV (see :mod:`.flush`); raises FlushError where SGLang's flush_cache can report it."""
        scheduler = getattr(sys.modules.get(SCHEDULER_MODULE), "Scheduler", None)
        self._clean = True  # failed or not: FlexKVRadixCache.reset's own call that follows does not flush again
        flush(self, self._wait_s, hooked_by(getattr(scheduler, "flush_cache", None), FLUSH_MODULE))

    def reset(self) -> None:
        """FlexKVRadixCache.reset's last step; the plugin's hook on it flushed FlexKV already (then nothing to do)."""
        if not self._clean:
            self.flush()

    def __getattr__(self, name: str) -> Any:
        """Everything else (drain_launched_loads, shutdown, ...) is FlexKV's, unchanged."""
        if name == "connector":
            raise AttributeError(name)
        return getattr(self.connector, name)


__all__ = ["CALLS", "PREFIX", "BridgeConnector", "ConnectorShape", "check_connector", "handle_key", "resolve_connector"]
