"""Two requests SGLang keeps apart (LoRA id, cache_salt) FlexKV keeps apart: FlexKV is skipped for them, and for
multimodal requests.

SGLang keys its radix tree by token ids plus ``extra_key`` (the LoRA id is appended to it,
schedule_batch.py:1165-1168; a LoRA name loaded again at another path gets another id) and ``cache_salt``;
``FlexKVRadixCache`` hands FlexKV token ids only. The namespaces come from SGLang's real ``Req``; the radix
cache, pools and allocator are SGLang's, the connector FlexKV 34ab141's.
"""

from __future__ import annotations

import pytest

from . import flexkv_faults
from . import flexkv_standin as fk
from .flexkv_faults import stored

faulty = flexkv_faults.faulty  # the fixture
IDS = list(range(1000, 1048))


def _namespace(images: int = 0, **kwargs):
    """``extra_key`` and ``cache_salt`` as SGLang's Req derives them; ``images``: SGLang's MultimodalInputs with
    that many (empty) items, as the scheduler attaches them to a multimodal request."""
    from sglang.srt.managers.schedule_batch import MultimodalInputs, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req("ns", "", IDS, SamplingParams(), **kwargs)
    multimodal = MultimodalInputs(mm_items=[None] * images) if images else None
    return {"extra_key": req.extra_key, "cache_salt": req.cache_salt, "multimodal_inputs": multimodal}


NAMESPACES = {
    "lora tenant1": {"lora_id": "tenant1"},
    "lora re-pointed": {"lora_id": "tenant1-reloaded"},
    "cache_salt tenant1": {"cache_salt": "tenant1"},
    "caller extra_key": {"extra_key": "tenant1"},
    "multimodal": {"images": 1},  # pad ids FlexKV's key was never proven to tell apart: bypassed
}


@pytest.mark.parametrize("name", NAMESPACES)
def test_a_namespaced_request_neither_hits_nor_stores_flexkv_kv(faulty, models, monkeypatch, name):
    from .radix_harness import Rig

    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)  # a request without a namespace, same tokens
    namespace = _namespace(**NAMESPACES[name])
    assert namespace["extra_key"] or namespace["cache_salt"] or namespace["multimodal_inputs"]
    matches, puts = len(fk.calls("get_match")), len(rig.cache.flexkv_connector.connector.kv_manager.tasks)
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **namespace))
    rig.finish(rig.request("t", IDS, prompt=40, seed=6, **namespace))
    assert loaded == 0 and len(fk.calls("get_match")) == matches  # FlexKV was not asked
    assert len(rig.cache.flexkv_connector.connector.kv_manager.tasks) == puts  # nor given its KV


def test_an_empty_cache_salt_is_no_namespace_as_in_sglang(faulty, models, monkeypatch):
    from .radix_harness import Rig

    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **_namespace(cache_salt="")))
    assert loaded == len(IDS)  # SGLang's Req reads "" as None: the same namespace as the base request


def test_negative_control_shared_namespaces_serve_the_base_request_kv_to_a_lora(sglang_env, models, monkeypatch):
    from .radix_harness import Rig

    monkeypatch.setenv("FLEXKV_ADAPTER_SGLANG_NAMESPACED_REQUESTS", "shared")
    flexkv_faults.load_faulty(sglang_env, monkeypatch)  # the same set-up, with the setting
    rig = Rig(monkeypatch, models["llama"], "mha")
    stored(rig, "base", IDS, seed=5)
    loaded, _ = rig.match_and_load(rig.request("t", IDS, prompt=40, allocate=False, **_namespace(lora_id="tenant1")))
    assert loaded == len(IDS)
