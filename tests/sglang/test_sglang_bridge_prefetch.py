"""Prefetch and cancel through the bridge: SGLang 0.5.23's real FlexKVRadixCache, FlexKV's prefetch API.

What SGLang 0.5.23 reaches on this backend (read from its source, shown by the last test):

* every abort: ``Scheduler._release_aborted_request`` -> ``tree_cache.finish(handle, ABORT)``
  (managers/scheduler.py:3548) -> ``release_aborted_request`` (mem_cache/base_prefix_cache.py:436-439)
  -> ``release_pending(handle)`` and ``cancel_prefetch(handle)`` (storage/flexkv/flexkv_radix_cache.py:481-489);
* ``prefetch_from_storage`` / ``check_prefetch_progress`` only with ``--hicache-storage-backend``
  (scheduler.py:516, 3343, 4240), and there ``_prefetch_kvcache`` first calls ``tree_cache.is_backuped``
  (scheduler.py:3365), which FlexKVRadixCache lacks, then ``prefetch_from_storage`` with nine arguments
  (scheduler.py:3381-3391) where FlexKVRadixCache takes three (flexkv_radix_cache.py:491). So 0.5.23
  never reaches ``prefetch_async``; the radix cache's own prefetch methods are driven directly here.

FlexKV's side: the stand-in of ``flexkv_prefetch``, or (``tests.flexkv_source``) FlexKV's real connector over
the same tiered data plane.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import pytest

from flexkv_adapter.integrations.sglang import bridge as sglang_bridge

from . import flexkv_standin as fk
from .flexkv_prefetch import TieredKVManager
from .radix_harness import RADIX, Rig, buffers, read, retake, untouched_outside, zero
from .real_flexkv import SKIP_REASON, SOURCE, prepare, replace_gpu_parts

IDS = list(range(1000, 1048))  # three pages


@pytest.fixture(params=["standin", "real"])
def make_rig(request, sglang_env, models, monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXKV_CPU_CACHE_GB", "1")
    monkeypatch.setenv("FLEXKV_SSD_CACHE_GB", "2")  # a tier below the CPU (FlexKV wants it larger): prefetch on
    monkeypatch.setenv("FLEXKV_SSD_CACHE_DIR", str(tmp_path / "ssd"))
    if request.param == "real":
        if not SOURCE:
            pytest.skip(SKIP_REASON)
        prepare(monkeypatch, SOURCE)
        sglang_env.load()
        monkeypatch.setattr(replace_gpu_parts(monkeypatch), "KVManager", TieredKVManager)
    else:
        sglang_env.use("prefetch")
        sglang_env.load()

    def make() -> Rig:
        rig = Rig(monkeypatch, models["llama"], "mha")
        served_by = inspect.getfile(type(rig.cache.flexkv_connector.connector))
        assert served_by.startswith(SOURCE) if request.param == "real" else served_by.endswith("flexkv_prefetch.py")
        return rig

    return make


def _stored_below_cpu(rig: Rig) -> tuple[list[bytes], Any, list[Any]]:
    """Store a request, evict it from the device, move its pages below the CPU; the pool as it stands."""
    req = rig.request("r1", IDS, prompt=40, seed=7)
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    for _ in range(2):
        rig.cache.check_hicache_events()
    assert rig.evict_all() == len(IDS)
    zero(rig.pool, req.slots)
    retake(rig.alloc, req.slots)
    assert rig.cache.flexkv_connector.connector.kv_manager.demote() == 3
    return expected, req.slots, [t.clone() for t in buffers(rig.pool)]


def _held(rig: Rig) -> list[int]:
    """What still holds resources after the test: the radix cache's and the connector's tracking, live tasks."""
    conn = rig.cache.flexkv_connector.connector
    assert not conn._pending_lookups and not conn._ongoing_prefetches and not conn._inflight_stores
    assert not rig.cache._load_markers and not rig.cache._inflight_store_nodes
    assert rig.cache.protected_size() == 0  # no radix lock left
    return [tid for tid, task in conn.kv_manager.tasks.items() if task.status not in ("success", "cancelled")]


def test_a_prefetch_runs_completes_and_the_restore_is_byte_exact_elsewhere(make_rig):
    rig = make_rig()
    conn = rig.cache.flexkv_connector.connector
    expected, old, before = _stored_below_cpu(rig)
    req = rig.request("r2", IDS, prompt=40, allocate=False)
    handle = req.cache_request_handle
    assert rig.match(req).host_hit_length == 0  # below the CPU: no hit until prefetched
    rig.cache.prefetch_from_storage(handle, rig.cache.root_node, IDS)
    assert list(conn._ongoing_prefetches) == ["r2@attempt0"]
    assert [rig.cache.check_prefetch_progress(handle) for _ in range(2)] == [False, True]  # running, then done
    loaded, slots = rig.load(req, rig.match(req))
    assert loaded == len(IDS) and slots is not None and not set(slots.tolist()) & set(old.tolist())
    assert read(rig.pool, slots) == expected and untouched_outside(before, rig.pool, slots)
    assert _held(rig) == []


def _two_attempts(rig: Rig, after_store: Any = None) -> dict[str, Any]:
    """Attempts 0 and 1 of one rid prefetch; attempt 0 is terminated, then both look up and attempt 0 aborts."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    conn = rig.cache.flexkv_connector.connector
    expected, _, before = _stored_below_cpu(rig)
    if after_store is not None:
        after_store()
    first = rig.request("r2", IDS, prompt=40, allocate=False)
    retry = rig.request("r2", IDS, prompt=40, attempt=1, allocate=False)
    for req in (first, retry):
        rig.cache.prefetch_from_storage(req.cache_request_handle, rig.cache.root_node, IDS)
    out: dict[str, Any] = {"prefetching": sorted(conn._ongoing_prefetches)}
    rig.cache.terminate_prefetch(first.cache_request_handle)
    out["tracked"] = sorted(conn._ongoing_prefetches)
    out["retry progress"] = [rig.cache.check_prefetch_progress(retry.cache_request_handle) for _ in range(2)]
    matched = rig.match(first), rig.match(retry)
    out["pending"] = sorted(conn._pending_lookups)
    retry_task = conn._pending_lookups.get("r2@attempt1")
    rig.cache.finish(first.cache_request_handle, CacheRequestOutcome.ABORT)  # the scheduler's abort path
    out["pending after abort"] = sorted(conn._pending_lookups)
    out["retry task cancelled"] = retry_task in [t for call in fk.calls("cancel") for t in call["task_ids"]]
    loaded, slots = rig.load(retry, matched[1])
    out["loaded"] = loaded
    out["exact"] = slots is not None and read(rig.pool, slots) == expected
    out["untouched"] = slots is not None and untouched_outside(before, rig.pool, slots)
    return out


def test_cancelling_one_attempt_never_touches_another_attempt_of_the_same_rid(make_rig):
    rig = make_rig()
    out = _two_attempts(rig)
    assert out == {
        "prefetching": ["r2@attempt0", "r2@attempt1"],
        "tracked": ["r2@attempt1"],  # terminate_prefetch dropped attempt 0 only
        "retry progress": [False, True],
        "pending": ["r2@attempt0", "r2@attempt1"],
        "pending after abort": ["r2@attempt1"],  # release_pending + cancel_prefetch of attempt 0 only
        "retry task cancelled": False,
        "loaded": len(IDS),
        "exact": True,
        "untouched": True,
    }
    (prefetch_0,) = _held(rig)  # FlexKV cannot cancel a prefetch: attempt 0's copy up is left to finish
    assert rig.cache.flexkv_connector.connector.kv_manager.tasks[prefetch_0].kind == "prefetch"


def test_negative_control_keys_without_the_attempt_let_one_attempt_cancel_the_other(make_rig, monkeypatch):
    rig = make_rig()
    out = _two_attempts(rig, lambda: monkeypatch.setattr(sglang_bridge, "handle_key", lambda handle: str(handle.rid)))
    assert out["tracked"] == [] and out["retry progress"] == [True, True] and out["loaded"] == 0


def _calls_in(path: Path, function: str) -> dict[str, list[ast.Call]]:
    """The ``tree_cache.<method>(...)`` calls inside ``function`` of an SGLang source file, by method name."""
    tree = ast.parse(path.read_text())
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    calls: dict[str, list[ast.Call]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if getattr(owner, "attr", getattr(owner, "id", None)) == "tree_cache":
                calls.setdefault(node.func.attr, []).append(node)
    return calls


@pytest.mark.parametrize(
    ("source", "function", "first"),
    [
        ("managers/scheduler.py", "_prefetch_kvcache", "is_backuped"),
        ("disaggregation/decode_hicache_mixin.py", "_start_hicache_prefetch", "get_last_hash_value"),
    ],
)
def test_sglang_0_5_23_never_reaches_prefetch_async_on_flexkv(sglang_env, source, function, first):
    """Both callers of prefetch_from_storage call a method FlexKVRadixCache lacks, then call it with 9 arguments."""
    sglang_env.use("serving")  # the radix cache module imports FlexKV
    FlexKVRadixCache = importlib.import_module(RADIX).FlexKVRadixCache

    path = Path(importlib.util.find_spec("sglang").origin).parent / "srt" / source  # not imported: needs a GPU stack
    calls = _calls_in(path, function)
    (prefetch,) = calls["prefetch_from_storage"]
    assert calls[first][0].lineno < prefetch.lineno and not hasattr(FlexKVRadixCache, first)
    with pytest.raises(TypeError):  # the call as written there cannot bind to FlexKVRadixCache's (handle, node, ids)
        inspect.signature(FlexKVRadixCache.prefetch_from_storage).bind(
            None, *prefetch.args, **{k.arg: None for k in prefetch.keywords if k.arg}
        )


def test_a_hicache_storage_backend_is_refused_at_start_not_at_the_first_request(sglang_env, models, monkeypatch):
    """With it set, 0.5.23's scheduler calls FlexKVRadixCache.is_backuped at every admission (above): refuse early."""
    from flexkv_adapter import AdapterError

    from .connectors import build
    from .pools import mha_pool

    sglang_env.use("serving")
    sglang_env.load()
    monkeypatch.setattr(fk.ServerArgs, "hicache_storage_backend", "file", raising=False)
    with pytest.raises(AdapterError, match="hicache_storage_backend='file'.*is_backuped"):
        build(mha_pool(), models["llama"])  # what FlexKVRadixCache builds: the bridge
    assert not fk.calls("register_to_server")
    monkeypatch.setattr(fk.ServerArgs, "hicache_storage_backend", None)
    build(mha_pool(), models["llama"])  # the default (no storage backend) is served
