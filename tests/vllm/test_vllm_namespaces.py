"""Namespaces through vLLM's real Scheduler (0.33 or 0.32) with the plugin: requests vLLM's prefix cache keeps
apart (``("lora", name, path)``, ``("cache_salt", salt)``: kv_cache_utils.py:590-607, 659-669) get no
FlexKV hit from each other, though FlexKV's untagged ``[lora_name, cache_salt]`` key (adp:344-390) would
give them one. Negative control: without the rule in ``excluded``, FlexKV serves the other namespace's KV.
"""

from __future__ import annotations

from typing import Any

import pytest

from flexkv_adapter.integrations.vllm import lifecycle as vllm_lifecycle

from .engine import Engine

A = list(range(200, 248))  # three blocks


def lora(name: str, path: str) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=1, lora_path=path)


def flexkv_hits(engine: Engine, req_id: str) -> list[int]:
    """num_computed_tokens each time the scheduler admitted the request as new (vLLM's cache was dropped)."""
    return [r.num_computed_tokens for so in engine.outputs for r in so.scheduled_new_reqs if r.req_id == req_id]


CASES = {
    "lora_name_vs_salt": ({"lora_request": lora("tenant1", "/adapters/t1")}, {"cache_salt": "tenant1"}),
    "lora_repointed": ({"lora_request": lora("t", "/adapters/v1")}, {"lora_request": lora("t", "/adapters/v2")}),
}


def serve_both(plugged: Any, tmp_path: Any, first: dict[str, Any], second: dict[str, Any]) -> Engine:
    engine = Engine(plugged, tmp_path)
    engine.serve("A", A, **first)
    engine.forget_local()  # only FlexKV could hit now
    engine.serve("B", A, **second)
    return engine


@pytest.mark.parametrize("case", list(CASES))
def test_requests_vllm_keeps_apart_get_no_flexkv_hit_from_each_other(plugged, tmp_path, case):
    engine = serve_both(plugged, tmp_path, *CASES[case])
    assert flexkv_hits(engine, "B") == [0]
    assert engine.flexkv.flexkv_stats.num_get_requests == 0  # FlexKV was never asked for either
    assert engine.finished["B"].name == "LENGTH" and engine.idle()


def test_a_plain_request_still_hits(plugged, tmp_path):
    engine = serve_both(plugged, tmp_path, {}, {})
    assert flexkv_hits(engine, "B") == [47]  # all but the last prompt token, which vLLM always computes


@pytest.mark.parametrize("case", list(CASES))
def test_negative_control_without_the_rule_flexkv_serves_the_other_namespace(plugged, tmp_path, monkeypatch, case):
    monkeypatch.setattr(
        vllm_lifecycle,
        "excluded",
        lambda r: bool(getattr(r, "mm_features", None)) or getattr(r, "prompt_embeds", None) is not None,
    )
    engine = serve_both(plugged, tmp_path, *CASES[case])
    assert flexkv_hits(engine, "B") != [0]
