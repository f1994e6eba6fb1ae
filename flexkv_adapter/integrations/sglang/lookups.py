"""A FlexKV lookup held for a request is released as soon as the request can no longer load it.

SGLang 0.5.23's ``FlexKVRadixCache._mp_match_prefix`` holds FlexKV's get task for a request from a hit
(storage/flexkv/flexkv_radix_cache.py:204-223: the connector keeps the task under the request's key, the
radix cache a load marker under its handle) until ``init_load_back`` launches or releases it (:279-312).
A later match of the same request replaces the held task only when it hits again (FlexKV's connector cancels
the one it replaces, connector.py:556-580). Two paths leave it held:

* the match returns early, without a lookup, when the prefix is now on the device (:196-197), or FlexKV
  misses (:207-208): the request's ``host_hit_length`` becomes 0 and ``init_load_back`` never runs for it
  (managers/schedule_policy.py:1470-1521). Under LPM, ``calc_priority`` matches every waiting request
  before any is admitted (:356), so requests sharing a prefix that the first of them then loads are admitted
  without a load; under FCFS the same follows a NO_TOKEN admission (the request is matched again later);
* ``on_release`` (:378-380) releases nothing, and drops the load marker only when not checkpointed.

FlexKV's get task keeps its matched CPU blocks locked (and its task-table entry) until the next flush, so
FlexKV's eviction cannot free them and, under steady traffic, its CPU tier fills with pinned blocks. The
hooks here (after SGLang's match, inside one AROUND hook that also runs the namespace hook; after
``on_release``) release the held lookup (``release_pending``, which SGLang's radix cache calls itself
where it knows, :292 and :488) and drop the load marker: on a match that leaves the request no FlexKV load,
and when the request is released (finished, retracted, aborted). ``release_pending`` is FlexKV's local
bookkeeping plus the leader's cancel, no collective: every TP rank takes the same decisions from the same
tree and FlexKV's scattered lookup answer.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

RADIX_CLASS = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache.FlexKVRadixCache"
LOAD_MARKERS = "_load_markers"  # FlexKVRadixCache's handle -> _LoadBackMarker (flexkv_radix_cache.py:127)


def release_held(radix: Any, handle: Any) -> None:
    """Release ``handle``'s held FlexKV lookup and its load marker, if it has either.

    The marker is set exactly where the connector holds a lookup (flexkv_radix_cache.py:207-215); the bridge
    also answers from FlexKV's own table (``holds_lookup``), SGLang's in-tree connector from the marker."""
    markers = getattr(radix, LOAD_MARKERS, None)
    marker = markers.pop(handle, None) if type(markers) is dict or isinstance(markers, MutableMapping) else None
    connector = getattr(radix, "flexkv_connector", None)
    holds = getattr(connector, "holds_lookup", None)
    if connector is not None and (marker is not None or (holds is not None and holds(handle))):
        connector.release_pending(handle)


def after_match_prefix(result: Any, self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
    """A match that gives the request no FlexKV load (on the device already, a miss, a bypass): the lookup an
    earlier match held for it is released. A hit replaced it already (FlexKV cancels the one it replaces).
    The match is counted for the hits line (:mod:`.hits_log`). A match of no request (RadixCache.checkpoint's
    own) holds and counts nothing."""
    req = getattr(params, "req", None)
    if req is None:
        return
    hit = getattr(result, "host_hit_length", 0)
    if not hit > 0:
        release_held(self, req.cache_request_handle)
    hits = getattr(getattr(self, "flexkv_connector", None), "hits_log", None)  # the leader's (.hits_log)
    if hits is not None:
        hits.lookup(len(params.key) - result.device_prefix_len, hit)


def after_on_release(result: Any, self: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    """A released request (finished, retracted or aborted) loads nothing any more: its held lookup is released."""
    release_held(self, req.cache_request_handle)


def match_hook(inner: Any = None) -> Any:
    """The AROUND hook on ``match_prefix``: ``inner`` (the namespace hook, :func:`.namespaces.match_hook`; None:
    SGLang's own match), then :func:`after_match_prefix`. One hook layer, where two (an AROUND and an AFTER) cost
    SGLang's wrapper twice on every match."""
    match = inner or _own_match

    def match_prefix(original: Any, self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        result = match(original, self, params, *args, **kwargs)
        after_match_prefix(result, self, params)
        return result

    return match_prefix


def _own_match(original: Any, self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    return original(self, params, *args, **kwargs)


def register_lookup_hooks(registry: Any, hook_type: Any, inner: Any = None) -> list[str]:
    """``inner``: the namespace hook on ``match_prefix``, run inside this one (None: no namespace hook)."""
    registry.register(f"{RADIX_CLASS}.match_prefix", match_hook(inner), hook_type.AROUND)
    registry.register(f"{RADIX_CLASS}.on_release", after_on_release, hook_type.AFTER)
    return [f"{RADIX_CLASS}.match_prefix/.on_release (a FlexKV lookup no load will use is released)"]


__all__ = ["LOAD_MARKERS", "after_match_prefix", "after_on_release", "match_hook", "register_lookup_hooks",
           "release_held"]  # fmt: skip
