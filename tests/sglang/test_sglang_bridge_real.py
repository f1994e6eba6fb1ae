"""The bridge against FlexKV's REAL connector Python (found by ``tests.flexkv_source``; skipped without it).

Only what needs a GPU or FlexKV's compiled extension is replaced: ``KVManager`` and ``KVTPClient``
(by the data plane of ``flexkv_serving``), ``torch.cuda.current_device``, and ``flexkv.c_ext``
(``tests/flexkv_cpu/c_ext.py``). Another checkout::

    FLEXKV_SOURCE=/path/to/FlexKV pytest tests/sglang/test_sglang_bridge_real.py
"""

from __future__ import annotations

import pytest

from flexkv_adapter.integrations.sglang.bridge import BridgeConnector

from .radix_harness import Rig, read
from .real_flexkv import SOURCE, needs_flexkv, prepare, replace_gpu_parts
from .test_sglang_bridge import IDS, _served

pytestmark = needs_flexkv


@pytest.fixture
def real_flexkv(sglang_env, monkeypatch):
    prepare(monkeypatch, SOURCE)
    sglang_env.load()
    return replace_gpu_parts(monkeypatch)


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_store_evict_restore_through_flexkv_real_connector(real_flexkv, models, monkeypatch, kind):
    rig = Rig(monkeypatch, models["llama" if kind == "mha" else "deepseek"], kind)
    bridge = rig.cache.flexkv_connector
    assert isinstance(bridge, BridgeConnector) and type(bridge.connector).__module__ == real_flexkv.__name__
    req, expected, loaded, slots, blocker, before = _served(rig)
    assert loaded == len(IDS) and not set(slots.tolist()) & set(req.slots.tolist())
    assert read(rig.pool, slots) == expected and read(rig.pool, blocker) == before


def test_retry_with_a_new_attempt_through_flexkv_real_connector(real_flexkv, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    rig.finish(rig.request("r1", IDS, prompt=40, seed=1))
    rig.finish(rig.request("r1", IDS[:32] + list(range(2000, 2016)), prompt=40, attempt=1, seed=2))
    assert set(rig.cache.flexkv_connector.connector._inflight_stores) == {"r1@attempt0", "r1@attempt1"}
    for _ in range(2):
        rig.cache.check_hicache_events()
    assert not rig.cache._inflight_store_nodes and rig.evict_all() == 64
