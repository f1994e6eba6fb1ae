"""Requests SGLang keys apart (a caller's ``extra_key``, a LoRA id, a ``cache_salt``) use FlexKV under a namespace of
their own; multimodal requests bypass FlexKV; ``skip`` and ``shared`` keep their meaning.

SGLang keys its radix tree by token ids plus ``extra_key`` (the LoRA id appended to it, schedule_batch.py:1165-1168;
a LoRA name loaded again at another path gets another id) and ``cache_salt``; ``FlexKVRadixCache`` hands FlexKV
token ids only. The namespaces come from SGLang's real ``Req``; the radix cache, pools and allocator are SGLang's,
the connector FlexKV 34ab141's, the KVManager the tier's stand-in (pages keyed by namespace and prefix). FlexKV's
own hashing of the namespaces: test_sglang_bridge_namespaces_kvmanager.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flexkv_adapter.integrations.sglang import namespaces as sglang_namespaces

from . import flexkv_faults
from . import flexkv_standin as fk
from .flexkv_faults import stored

faulty = flexkv_faults.faulty  # the fixture
IDS = list(range(1000, 1048))


def _namespace(images: int = 0, **kwargs):
    """``extra_key``, ``lora_id`` and ``cache_salt`` as SGLang's Req derives them; ``images``: SGLang's
    MultimodalInputs with that many (empty) items, as the scheduler attaches them to a multimodal request."""
    from sglang.srt.managers.schedule_batch import MultimodalInputs, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req("ns", "", IDS, SamplingParams(), **kwargs)
    multimodal = MultimodalInputs(mm_items=[None] * images) if images else None
    return {"extra_key": req.extra_key, "cache_salt": req.cache_salt, "multimodal_inputs": multimodal,
            "lora_id": req.lora_id}  # fmt: skip


NAMESPACES = {
    "base": {},
    "lora tenant1": {"lora_id": "tenant1"},
    "lora re-pointed": {"lora_id": "tenant1-reloaded"},
    "cache_salt tenant1": {"cache_salt": "tenant1"},
    "caller extra_key tenant1": {"extra_key": "tenant1"},
    "caller extra_key empty": {"extra_key": ""},  # SGLang's tree keys "" apart from none
    "caller extra_key ten + lora ant1": {"extra_key": "ten", "lora_id": "ant1"},  # SGLang's joined key: "tenant1"
    "lora tenant1 + cache_salt": {"lora_id": "tenant1", "cache_salt": "s"},
}


def restored(rig, namespace: dict) -> int:
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **_namespace(**namespace)))
    return loaded


@pytest.mark.parametrize("first", NAMESPACES)
def test_each_namespace_restores_only_its_own_kv(faulty, models, monkeypatch, first):
    from .radix_harness import Rig, read

    rig = Rig(monkeypatch, models["llama"], "mha")
    req = rig.request("a", IDS, prompt=40, seed=5, **_namespace(**NAMESPACES[first]))
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    for _ in range(3):
        rig.cache.check_hicache_events()
    rig.evict_all()
    for second, namespace in NAMESPACES.items():
        if second != first:
            assert restored(rig, namespace) == 0, second
    same = rig.request("b", IDS, prompt=40, allocate=False, **_namespace(**NAMESPACES[first]))
    loaded, slots = rig.match_and_load(same)
    assert loaded == len(IDS) and read(rig.pool, slots) == expected


def test_negative_control_a_namespace_not_handed_to_flexkv_serves_the_base_kv_to_a_lora(faulty, models, monkeypatch):
    from .radix_harness import Rig

    monkeypatch.setattr(sglang_namespaces, "_carried", lambda radix, namespace, call, *a, **kw: call(*a, **kw))
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    assert restored(rig, {"lora_id": "tenant1"}) == len(IDS)


@pytest.mark.parametrize("namespace", [{"lora_id": "tenant1"}, {"images": 1}], ids=["lora", "multimodal"])
def test_negative_control_shared_namespaces_serve_the_base_request_kv(sglang_env, models, monkeypatch, namespace):
    from .radix_harness import Rig

    monkeypatch.setenv("FLEXKV_ADAPTER_SGLANG_NAMESPACED_REQUESTS", "shared")
    flexkv_faults.load_faulty(sglang_env, monkeypatch)  # the same set-up, with the setting
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    assert restored(rig, namespace) == len(IDS)


def test_a_multimodal_request_neither_hits_nor_stores_flexkv_kv(faulty, models, monkeypatch):
    from .radix_harness import Rig

    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    namespace = _namespace(images=1)
    matches, puts = len(fk.calls("get_match")), len(rig.cache.flexkv_connector.connector.kv_manager.tasks)
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **namespace))
    rig.finish(rig.request("t", IDS, prompt=40, seed=6, **namespace))
    assert loaded == 0 and len(fk.calls("get_match")) == matches  # FlexKV was not asked
    assert len(rig.cache.flexkv_connector.connector.kv_manager.tasks) == puts  # nor given its KV


@pytest.mark.parametrize("name", ["lora tenant1", "cache_salt tenant1", "caller extra_key tenant1"])
def test_with_skip_a_namespaced_request_neither_hits_nor_stores_flexkv_kv(sglang_env, models, monkeypatch, name):
    from .radix_harness import Rig

    monkeypatch.setenv("FLEXKV_ADAPTER_SGLANG_NAMESPACED_REQUESTS", "skip")
    flexkv_faults.load_faulty(sglang_env, monkeypatch)
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    namespace = _namespace(**NAMESPACES[name])
    matches, puts = len(fk.calls("get_match")), len(rig.cache.flexkv_connector.connector.kv_manager.tasks)
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **namespace))
    rig.finish(rig.request("t", IDS, prompt=40, seed=6, **namespace))
    assert loaded == 0 and len(fk.calls("get_match")) == matches
    assert len(rig.cache.flexkv_connector.connector.kv_manager.tasks) == puts


def test_an_empty_cache_salt_is_no_namespace_as_in_sglang(faulty, models, monkeypatch):
    from .radix_harness import Rig

    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    assert restored(rig, {"cache_salt": ""}) == len(IDS)  # SGLang's Req reads "" as None: the base namespace


def _radix(connector_cls: type, page_size: int = 16) -> SimpleNamespace:
    return SimpleNamespace(flexkv_connector=connector_cls(), page_size=page_size)


def test_a_namespace_the_connector_cannot_carry_is_refused_with_its_reason():
    from flexkv_adapter.integrations.sglang.bridge import BridgeConnector

    req = SimpleNamespace(**_namespace(lora_id="tenant1"))
    carrier = type("Carrier", (), {"carries_namespaces": True})
    leader_without_recorder = type("Leader", (), {"carries_namespaces": True, "leader": True, "observed": None})
    with pytest.raises(sglang_namespaces.Uncarried, match="no KVManager recorder"):
        sglang_namespaces.namespace_for(_radix(leader_without_recorder), req)
    with pytest.raises(sglang_namespaces.Uncarried, match="in-tree connector"):
        sglang_namespaces.namespace_for(_radix(type("InTree", (), {})), req)
    with pytest.raises(sglang_namespaces.Uncarried, match="tokens_per_block=1 "):
        sglang_namespaces.namespace_for(_radix(carrier, page_size=1), req)
    assert sglang_namespaces.namespace_for(_radix(carrier), req)
    assert BridgeConnector.carries_namespaces is True


def test_a_joined_key_that_does_not_end_with_the_lora_id_is_refused():
    req = SimpleNamespace(extra_key="tenant1", lora_id="other", cache_salt=None)
    with pytest.raises(sglang_namespaces.Uncarried, match="does not end with"):
        sglang_namespaces.extras(req)


def test_a_field_that_is_not_a_plain_str_is_refused():
    class Salt(str):
        pass

    req = SimpleNamespace(extra_key=None, lora_id=None, cache_salt=Salt("s"))
    carrier = type("Carrier", (), {"carries_namespaces": True})
    with pytest.raises(sglang_namespaces.Uncarried, match="not Salt"):
        sglang_namespaces.namespace_for(_radix(carrier), req)


def test_a_nested_call_keeps_the_outer_namespace_and_refuses_another():
    from flexkv_adapter.errors import AdapterError

    observed = SimpleNamespace(namespace=["outer"])
    radix = SimpleNamespace(flexkv_connector=SimpleNamespace(observed=observed))
    seen = sglang_namespaces._carried(radix, ["outer"], lambda: observed.namespace)
    assert seen == ["outer"] and observed.namespace == ["outer"]  # restored, not cleared
    with pytest.raises(AdapterError, match="nested"):
        sglang_namespaces._carried(radix, ["inner"], lambda: None)
    assert observed.namespace == ["outer"]


def test_a_lora_id_without_the_joined_extra_key_is_namespaced_not_served_plain():
    req = SimpleNamespace(extra_key=None, lora_id="tenant1", cache_salt=None, multimodal_inputs=None)
    assert sglang_namespaces.namespaced(req)
    with pytest.raises(sglang_namespaces.Uncarried, match="does not end with"):
        sglang_namespaces.extras(req)
