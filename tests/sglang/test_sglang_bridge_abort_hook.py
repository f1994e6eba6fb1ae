"""The abort hook must never silently do nothing while the bridge serves.

The hook fell back to SGLang's own release (the lock dropped at once) whenever ``_inflight_store_nodes`` was
not exactly a ``dict`` or ``_node_lock`` was missing, and the bridge's "hook applied" check still passed:
a FlexKVRadixCache that keeps its in-flight stores in another mapping served another request's bytes
under the aborted prefix.
"""

from __future__ import annotations

import collections
import functools
import importlib

import pytest

from flexkv_adapter import AdapterError

from . import flexkv_standin as fk
from .radix_harness import RADIX, Rig
from .test_sglang_bridge_abort import IDS, _aborted_after_store


def _radix():
    return importlib.import_module(RADIX).FlexKVRadixCache


def test_an_abort_keeps_the_lock_whatever_mapping_holds_the_in_flight_stores(sglang_env, models, monkeypatch):
    """SGLang's code works with any mutable mapping there (pop, [], clear); so must the hook."""
    sglang_env.use("serving")
    sglang_env.load()
    cls, init = _radix(), _radix().__init__

    @functools.wraps(init)
    def with_user_dict(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._inflight_store_nodes = collections.UserDict(self._inflight_store_nodes)

    monkeypatch.setattr(cls, "__init__", with_user_dict)
    rig = Rig(monkeypatch, models["llama"], "mha")
    assert isinstance(rig.cache._inflight_store_nodes, collections.UserDict)
    _, evicted, loaded, exact = _aborted_after_store(rig)
    assert evicted == 0  # the store still reads them: not evictable
    assert loaded == len(IDS) and exact  # not another request's bytes


def test_the_bridge_refuses_a_flexkvradixcache_whose_init_keeps_no_store_locks(sglang_env, models, monkeypatch):
    """An SGLang that renames ``_inflight_store_nodes`` / ``_node_lock``: the hook could keep nothing; the
    bridge refuses to serve rather than let aborts free slots FlexKV still copies."""
    sglang_env.use("serving")
    sglang_env.load()
    cls, init = _radix(), _radix().__init__

    def renamed(self, *args, **kwargs):  # no __wrapped__: this is the class's own __init__ now
        init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", renamed)
    with pytest.raises(AdapterError, match="_inflight_store_nodes"):
        Rig(monkeypatch, models["llama"], "mha")
    assert not fk.calls("register_to_server")


def test_an_abort_the_hook_cannot_keep_is_an_error_not_a_silent_release(sglang_env, models, monkeypatch):
    sglang_env.use("serving")
    sglang_env.load()
    rig = Rig(monkeypatch, models["llama"], "mha")
    req = rig.request("r1", IDS, prompt=40, seed=7)
    rig.finish(req)
    rig.cache._inflight_store_nodes = tuple(rig.cache._inflight_store_nodes.items())  # no mapping at all
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    with pytest.raises(AdapterError, match="in-flight"):
        rig.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
