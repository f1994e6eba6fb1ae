"""LoRA and cache_salt requests through vLLM's real Scheduler (0.32-0.34) with the plugin: each is offloaded under a
FlexKV namespace of its own, derived from vLLM's tagged extras (``("lora", name, path)``, ``("cache_salt", salt)``:
kv_cache_utils.py:590-607, 659-669) by :mod:`flexkv_adapter.integrations.vllm.namespaces`.

FlexKV's KVManager stand-in keys blocks by FlexKV's own block hashes (``block.py`` from the FlexKV tree), so a
namespace collides here exactly where it would collide in FlexKV. The stand-in model's KV depends on the LoRA (as a
real adapter's does): a restore shows whose KV it was. Negative controls: FlexKV's own ``_extract_namespace``
(untagged ``[lora_name, cache_salt]``) serves one namespace's KV to another, and to a plain prompt that spells the
LoRA's name, where a flat hash index (as this stand-in's) holds that spelling's blocks; so does a namespace component
whose length is a multiple of the block size.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexkv_adapter.flexkv import namespace as fa_namespace

from .engine import BLOCK, Engine, adapter_of

A = list(range(200, 248))  # three blocks
B = A + list(range(900, 908))  # A's three blocks, then a partial one: FlexKV can serve all of A


def lora(name: str, path: str) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=1, lora_path=path)


def admitted(engine: Engine, req_id: str) -> list[int]:
    """num_computed_tokens each time the scheduler admitted the request as new (vLLM's cache was dropped)."""
    return [r.num_computed_tokens for so in engine.outputs for r in so.scheduled_new_reqs if r.req_id == req_id]


def stored_then_asked(plugged: Any, tmp_path: Any, first: dict[str, Any], second: dict[str, Any],
                      tokens: list[int] = B, own_rule: bool = False) -> tuple[Engine, Any]:  # fmt: skip
    """A served under ``first`` and stored in FlexKV; vLLM's own cache dropped; B asked under ``second`` and run
    until it computes. ``own_rule``: FlexKV's own ``_extract_namespace`` instead of the plugin's."""
    engine = Engine(plugged, tmp_path)
    if own_rule:
        del engine.flexkv._extract_namespace  # the plugin's instance attribute: FlexKV's method is what remains
    engine.serve("A", A, **first)
    engine.forget_local()  # only FlexKV could hit now
    b = engine.add("B", tokens, **second)
    engine.run(lambda: b.status.name == "RUNNING")
    return engine, b


HITS = {
    "same lora": ({"lora_request": lora("t1", "/adapters/t1")}, {"lora_request": lora("t1", "/adapters/t1")}),
    "same salt": ({"cache_salt": "s1"}, {"cache_salt": "s1"}),
    "same lora and salt": (
        {"lora_request": lora("t1", "/adapters/t1"), "cache_salt": "s1"},
        {"lora_request": lora("t1", "/adapters/t1"), "cache_salt": "s1"},
    ),
    "plain": ({}, {}),
}
MISSES = {
    "lora name vs same-named salt": ({"lora_request": lora("t1", "/adapters/t1")}, {"cache_salt": "t1"}),
    "lora re-pointed to a new path": (
        {"lora_request": lora("t1", "/adapters/v1")},
        {"lora_request": lora("t1", "/adapters/v2")},
    ),
    "another lora": ({"lora_request": lora("t1", "/adapters/t1")}, {"lora_request": lora("t2", "/adapters/t2")}),
    "base after a lora": ({"lora_request": lora("t1", "/adapters/t1")}, {}),
    "lora after a base": ({}, {"lora_request": lora("t1", "/adapters/t1")}),
    "base after a salt": ({"cache_salt": "s1"}, {}),
    "another salt": ({"cache_salt": "s1"}, {"cache_salt": "s2"}),
    "salt vs lora and salt": ({"cache_salt": "s1"}, {"lora_request": lora("t1", "/adapters/t1"), "cache_salt": "s1"}),
    "NUL-joined components": (
        {"lora_request": lora("a\x00b", "/p")},
        {"lora_request": lora("a", "/p"), "cache_salt": "b"},
    ),
}


@pytest.mark.parametrize("case", list(HITS))
def test_the_same_namespace_again_restores_its_own_kv_from_flexkv(plugged, tmp_path, case):
    first, second = HITS[case]
    engine, b = stored_then_asked(plugged, tmp_path, first, second)
    assert admitted(engine, "B") == [48]  # A's three blocks, from FlexKV
    assert engine.holds("B", A, 3, adapter_of(b))  # B's forward wrote block 3 only: 0-2 are FlexKV's copy
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH"


@pytest.mark.parametrize("case", list(MISSES))
def test_another_namespace_gets_no_flexkv_hit(plugged, tmp_path, case):
    engine, _ = stored_then_asked(plugged, tmp_path, *MISSES[case])
    assert admitted(engine, "B") == [0]
    assert engine.flexkv.flexkv_stats.num_get_requests >= 1  # FlexKV was asked, under B's own namespace
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH"


@pytest.mark.parametrize("case", ["lora name vs same-named salt", "lora re-pointed to a new path"])
def test_negative_control_flexkvs_own_namespace_serves_another_namespaces_kv(plugged, tmp_path, case):
    engine, _ = stored_then_asked(plugged, tmp_path, *MISSES[case], own_rule=True)
    assert admitted(engine, "B") == [48]


def spelled(component: str) -> list[int]:
    """A plain prompt's token ids that FlexKV hashes exactly as it hashes the namespace ``[component]``."""
    return list(component.encode())


def spelled_after(plugged: Any, tmp_path: Any, name: str, component: str, own_rule: bool = False) -> list[int]:
    """A LoRA request's A stored, then a plain prompt spelling ``component`` stored (a flat hash index, as this
    KVManager stand-in is, then holds its blocks too); B asked plain, after that spelling: its admissions."""
    engine = Engine(plugged, tmp_path)
    if own_rule:
        del engine.flexkv._extract_namespace
    engine.serve("A", A, lora_request=lora(name, "/adapters/t"))
    engine.serve("P", spelled(component))
    engine.forget_local()
    b = engine.add("B", spelled(component) + B)
    engine.run(lambda: b.status.name == "RUNNING")
    return admitted(engine, "B")


def test_a_plain_prompt_spelling_a_namespace_gets_only_its_own_blocks(plugged, tmp_path):
    (component,) = fa_namespace.namespace_of([("lora", "t1", "/adapters/t")]) or [""]
    assert len(component) == fa_namespace.COMPONENT_LEN
    own = len(component) // BLOCK * BLOCK  # P's whole blocks
    assert spelled_after(plugged, tmp_path, "t1", component) == [own]


def test_negative_control_a_block_aligned_component_is_reached_by_a_plain_prompt(plugged, tmp_path, monkeypatch):
    monkeypatch.setattr(fa_namespace, "_HEX", 4 * BLOCK - len(fa_namespace.TAG))  # a 64-character component
    (component,) = fa_namespace.namespace_of([("lora", "t1", "/adapters/t")]) or [""]
    assert spelled_after(plugged, tmp_path, "t1", component) == [4 * BLOCK + 48]  # + the LoRA's three blocks


def test_negative_control_flexkvs_own_namespace_is_reached_by_a_plain_prompt(plugged, tmp_path):
    name = "tenant-0123456789"[:BLOCK]  # FlexKV's own component is the bare name: one block's worth of bytes
    assert spelled_after(plugged, tmp_path, name, name, own_rule=True) == [BLOCK + 48]


def test_multimodal_and_prompt_embeds_requests_still_bypass_flexkv():
    from flexkv_adapter.integrations.vllm.namespaces import excluded

    class Request:
        mm_features, prompt_embeds, lora_request, cache_salt = [object()], None, None, None

    embeds = type("Embeds", (), {"mm_features": None, "prompt_embeds": object()})()
    assert excluded(Request()) and excluded(embeds)
    assert not excluded(type("Plain", (), {"mm_features": [], "prompt_embeds": None, "cache_salt": "s"})())


NAMES = st.text(st.characters(codec="utf-8") | st.just("\x00"), max_size=8)
EXTRAS = st.lists(
    st.tuples(st.just("lora"), NAMES, NAMES) | st.tuples(st.just("cache_salt"), NAMES.filter(bool)), max_size=2
)


def block_hashes(tokens: list[int], tokens_per_block: int, namespace: list[str] | None) -> set[int]:
    """FlexKV's own block hashes (block.py's SequenceMeta, from the FlexKV tree) of a sequence."""
    import numpy as np
    from flexkv.kvmanager import _sequence_meta

    ids = np.asarray(tokens, dtype=np.int64)
    return {int(h) for h in _sequence_meta()(ids, tokens_per_block, namespace).block_hashes}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EXTRAS, EXTRAS, st.lists(st.integers(0, 300), min_size=64, max_size=160), st.sampled_from([2, 4, 8, 16, 32]))
def test_flexkv_hashes_no_block_alike_across_namespaces_or_for_a_plain_prompt_spelling_one(
    connector_cls, a, b, tokens, tokens_per_block
):
    ns_a, ns_b = fa_namespace.namespace_of(a), fa_namespace.namespace_of(b)
    hashes_a = block_hashes(tokens, tokens_per_block, ns_a)
    if a != b:
        assert not hashes_a & block_hashes(tokens, tokens_per_block, ns_b)
    if ns_a is not None:
        assert not hashes_a & block_hashes(spelled(ns_a[0]) + tokens, tokens_per_block, None)


def test_negative_control_flexkv_hashes_a_block_aligned_namespace_like_a_plain_prompt(connector_cls):
    tokens = list(range(64))
    name = "x" * 16
    assert block_hashes(tokens, 16, [name]) <= block_hashes(spelled(name) + tokens, 16, None)


class Name(str):
    """A LoRA name that is a str subclass (module level: vLLM pickles the extras it hashes)."""


def test_a_lora_whose_name_is_not_a_plain_str_bypasses_flexkv_instead_of_raising(plugged, tmp_path):
    engine = Engine(plugged, tmp_path)
    engine.serve("A", A, lora_request=lora("t1", "/adapters/t1"))
    engine.forget_local()
    b = engine.add("B", B, lora_request=lora(Name("t1"), "/adapters/t1"))
    engine.run(lambda: b.status.name == "RUNNING")
    assert admitted(engine, "B") == [0]
    engine.run(engine.idle)
    assert engine.finished["B"].name == "LENGTH"
