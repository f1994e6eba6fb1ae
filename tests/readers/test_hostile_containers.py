"""A list or tuple subclass whose dunders raise or lie is read as what it holds: adapt() and plan() give the
view of the plain container, or an AdapterError, never a raw exception (the contract: only AdapterError leaves).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError, adapt, plan
from flexkv_adapter.readers import containers, sources, vllm_layout

DUNDERS = ("__iter__", "__len__", "__bool__", "__getitem__", "__eq__", "__hash__", "__contains__", "__reversed__")


EMPTY = {"__iter__": iter(()), "__len__": 0, "__bool__": False, "__contains__": False}


def hostile(base: type, dunders: frozenset[str], lie: bool, answers: dict[str, Any] | None = None) -> type:
    """A ``base`` subclass whose ``dunders`` raise, or (``lie``) answer from ``answers`` (default: as an empty
    container would; a name missing there answers True)."""

    def make(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not lie:
                raise RuntimeError(f"{name} raised")
            return (EMPTY if answers is None else answers).get(name, True)

        return method

    return type(f"Hostile{base.__name__.title()}", (base,), {n: make(n) for n in dunders})


def tensors(start: int) -> list[torch.Tensor]:
    return [torch.arange(80 * 2 * 8, dtype=torch.float32).add(start + 1000 * i).to(torch.bfloat16).view(80, 2, 8)
            for i in range(2)]  # fmt: skip


K, V = tensors(0), tensors(500)  # the same memory under the hostile and the plain containers


def shapes(where: str, cls: type) -> tuple[Any, dict[str, Any]]:
    k, v = K, V
    if where == "attrs":
        return SimpleNamespace(k_buffer=cls(k), v_buffer=cls(v), page_size=16), {}
    if where == "pool":
        return cls([cls(k), cls(v)]), {"axes": "KV L N H D", "page_size": 16}
    return cls([cls(pair) for pair in zip(k, v)]), {"axes": "L KV N H D", "page_size": 16}


def outcome(route: Any, source: Any, options: dict[str, Any]) -> Any:
    try:
        got = route(source, **options)
    except AdapterError as exc:
        return type(exc)
    return tuple(t.data_ptr() for t in (got.tensors() if hasattr(got, "tensors") and callable(got.tensors)
                                        else got.tensors))  # fmt: skip


@given(
    base=st.sampled_from([list, tuple]),
    dunders=st.frozensets(st.sampled_from(DUNDERS), min_size=1),
    lie=st.booleans(),
    where=st.sampled_from(["attrs", "pool", "pairs"]),
    route=st.sampled_from([adapt, plan]),
)
def test_a_hostile_container_reads_as_the_plain_one_or_is_an_adapter_error(base, dunders, lie, where, route):
    source, options = shapes(where, hostile(base, dunders, lie))
    plain_source, _ = shapes(where, base)
    got = outcome(route, source, options)
    assert got == outcome(route, plain_source, options) or (isinstance(got, type) and issubclass(got, AdapterError))


def test_negative_control_read_through_its_own_dunders_a_hostile_container_escapes_raw(monkeypatch):
    for module in (containers, sources):
        monkeypatch.setattr(module, "plain", lambda value: value)
    source, options = shapes("pool", hostile(list, frozenset({"__iter__"}), lie=False))
    with pytest.raises(RuntimeError, match="__iter__ raised"):
        adapt(source, **options)


NAME_METHODS = ("endswith", "startswith", "split", "rsplit", "partition", "__contains__", "__len__", "__getitem__")
MAPPING_METHODS = ("__iter__", "__len__", "__bool__", "__getitem__", "__contains__", "keys", "values", "get")


def lying_or_raising(base: type, methods: frozenset[str], lie: bool) -> type:
    """A ``base`` subclass whose ``methods`` raise, or (``lie``) answer True (iteration: nothing)."""
    return hostile(base, methods, lie, {"__iter__": iter(())})


VLLM_BUFFER = torch.arange(2 * 4 * 16 * 2 * 16, dtype=torch.float32).to(torch.bfloat16).view(2, 4, 16, 2, 16)


def vllm_dict(mapping: type, name: type) -> dict[str, torch.Tensor]:
    """vLLM 0.33's ``register_kv_caches`` input, ``[B, H, N, C]`` views of one LBNHC buffer, in ``mapping``
    with ``name`` layer names."""
    built = dict.__new__(mapping)
    for layer in range(2):
        dict.__setitem__(built, name(f"model.layers.{layer}.self_attn.attn"), VLLM_BUFFER[layer].permute(0, 2, 1, 3))
    return built


@given(
    mapping=st.frozensets(st.sampled_from(MAPPING_METHODS)),
    name=st.frozensets(st.sampled_from(NAME_METHODS)),
    lie=st.booleans(),
    route=st.sampled_from([adapt, plan]),
)
def test_a_hostile_layer_dict_or_layer_name_reads_as_the_plain_one_or_is_an_adapter_error(mapping, name, lie, route):
    """A dict subclass's dunders or a ``str`` subclass name's methods, raising or lying, never change which
    bytes are read (vLLM hands a plain dict of plain names) and never escape as a raw exception."""
    source = vllm_dict(lying_or_raising(dict, mapping, lie), lying_or_raising(str, name, lie))
    options = VLLM_OPTIONS if route is plan else {}
    got = outcome(route, source, options)
    plain_got = outcome(route, vllm_dict(dict, str), options)
    assert got == plain_got or (isinstance(got, type) and issubclass(got, AdapterError))


VLLM_OPTIONS = {"kind": "mha", "page_size": 16}


def test_the_plain_vllm_dict_is_planned_not_refused():
    assert not isinstance(outcome(plan, vllm_dict(dict, str), VLLM_OPTIONS), type)


def test_negative_control_read_through_its_own_methods_a_hostile_layer_name_escapes_raw(monkeypatch):
    from flexkv_adapter.readers import vllm_detect

    monkeypatch.setattr(vllm_detect, "layer_items", lambda obj: list(obj.items()))
    monkeypatch.setattr(vllm_layout, "layer_items", lambda obj: list(obj.items()))
    with pytest.raises(RuntimeError, match="endswith raised"):
        plan(vllm_dict(dict, lying_or_raising(str, frozenset({"endswith"}), lie=False)), **VLLM_OPTIONS)


class HashedApart(str):
    """A layer name with the same characters as a plain one that hashes and compares apart."""

    def __hash__(self) -> int:
        return 7 + len(self)

    def __eq__(self, other: object) -> bool:
        return self is other


def test_layer_names_that_hash_apart_are_read_by_their_characters():
    assert outcome(plan, vllm_dict(dict, HashedApart), VLLM_OPTIONS) == outcome(
        plan, vllm_dict(dict, str), VLLM_OPTIONS
    )


def test_two_keys_of_the_same_characters_are_refused_not_merged():
    name = "model.layers.0.self_attn.attn"
    source = {name: VLLM_BUFFER[0].permute(0, 2, 1, 3), HashedApart(name): VLLM_BUFFER[1].permute(0, 2, 1, 3)}
    with pytest.raises(AdapterError, match="appear twice"):
        plan(source, **VLLM_OPTIONS)
