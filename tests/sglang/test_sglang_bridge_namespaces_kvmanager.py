"""Namespaces through FlexKV's REAL KVManager (its whole Python: the namespace joined and hashed ahead of the token ids
by block.py, the radix index, the transfer processes; only its compiled parts replaced): a LoRA's prompt stored
under its namespace is restored byte-exact to the same LoRA, and to no other namespace SGLang keeps apart.
Negative control: FlexKV's own rule (the bare LoRA id and salt as components) serves the LoRA's KV to a
same-named salt.
"""

from __future__ import annotations

from flexkv_adapter.integrations.sglang import namespaces as sglang_namespaces

from .radix_harness import Rig, read
from .real_flexkv import needs_flexkv
from .test_sglang_bridge import IDS
from .test_sglang_bridge_flexkv_kvmanager import _stored_and_evicted, flexkv  # noqa: F401  (the fixture)
from .test_sglang_bridge_namespaces import _namespace

pytestmark = needs_flexkv
OTHERS = ({}, {"lora_id": "tenant2"}, {"cache_salt": "tenant1"}, {"extra_key": "tenant1"},
          {"extra_key": "ten", "lora_id": "ant1"})  # fmt: skip


def _stored(rig: Rig, rid: str, ids: list[int], **namespace: str) -> list[bytes]:
    """A finished request's bytes, once FlexKV's copy is done and the device dropped them."""
    rig.evict_all()
    req = rig.request(rid, ids, prompt=40, seed=7, **_namespace(**namespace))
    expected = read(rig.pool, req.slots)
    rig.finish(req)
    assert _stored_and_evicted(rig) == len(ids)
    return expected


def _loaded(rig: Rig, rid: str, ids: list[int], **namespace: str) -> tuple[int, list[bytes] | None]:
    """What FlexKV restores for a new request (nothing of it is on the device: a hit is FlexKV's)."""
    rig.evict_all()
    req = rig.request(rid, ids, prompt=40, allocate=False, **_namespace(**namespace))
    match = rig.match(req)
    assert match.device_prefix_len == 0
    loaded, slots = rig.load(req, match)
    return loaded, (read(rig.pool, slots) if slots is not None else None)


def test_flexkvs_real_kvmanager_restores_a_namespace_only_its_own_kv(flexkv, monkeypatch, models):  # noqa: F811
    _, rigs = flexkv
    rig = Rig(monkeypatch, models["llama"], "mha")  # FlexKV starts here (~20 s)
    rigs.append(rig)
    expected = _stored(rig, "a", IDS, lora_id="tenant1")
    for i, other in enumerate(OTHERS):
        assert _loaded(rig, f"other{i}", IDS, **other)[0] == 0, other
    assert _loaded(rig, "same", IDS, lora_id="tenant1") == (len(IDS), expected)

    # negative control (same FlexKV, to start it once): FlexKV's own rule, the bare id and salt as components
    monkeypatch.setattr(sglang_namespaces, "namespace_of", lambda extras: [str(e[-1]) for e in extras] or None)
    ids = [i + 5000 for i in IDS]
    _stored(rig, "c", ids, lora_id="tenant9")
    assert _loaded(rig, "salted", ids, cache_salt="tenant9")[0] == len(ids)
