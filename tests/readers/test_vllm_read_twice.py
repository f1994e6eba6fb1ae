"""A vLLM dict read twice must show one memory on both the adapt() and the plan() path.

``plan()`` of a vLLM dict built FlexKV's tensors from ``kv_caches[name]``, after the geometry was read from
``items()``: a ``dict`` subclass whose ``[]`` hands out copies was registered as copies (FlexKV would store
and restore throwaway memory), where ``adapt()`` of the same dict refused it (recognize's read-twice rule).
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter import adapt
from flexkv_adapter.errors import NotAddressableError
from flexkv_adapter.flexkv import plan
from flexkv_adapter.readers.vllm_layout import LAYOUTS

from ..strategies.vllm import layer_views


class CopiesOnGet(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: Any) -> Any:
        return dict.__getitem__(self, key).clone()


class CopiesInItems(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        return [(k, v.clone()) for k, v in dict.items(self)]


class CopiesInValues(dict):  # type: ignore[type-arg]
    def values(self) -> Any:
        return [v.clone() for v in dict.values(self)]


class ContiguousOnGet(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: Any) -> Any:
        return dict.__getitem__(self, key).contiguous()  # a copy only where the layout is not contiguous


class CopiesOnSecondGet(dict):  # type: ignore[type-arg]
    """Its own memory on the first read of each key, a copy on every later one."""

    def __getitem__(self, key: Any) -> Any:
        seen = self.__dict__.setdefault("seen", set())
        value = dict.__getitem__(self, key)
        if key in seen:
            return value.clone()
        seen.add(key)
        return value


class MirroredKeysAndGet(dict):  # type: ignore[type-arg]
    """keys() reversed and [] answering each name with its mirror's tensor: read in keys() order, the values
    line up with items() position by position, while every name maps to another layer's memory."""

    def keys(self) -> Any:
        return list(dict.keys(self))[::-1]

    def __getitem__(self, key: Any) -> Any:
        names = list(dict.keys(self))
        return dict.__getitem__(self, names[len(names) - 1 - names.index(key)])


KINDS = [dict, MirroredKeysAndGet, CopiesOnGet, CopiesInItems, CopiesInValues, ContiguousOnGet, CopiesOnSecondGet]


@st.composite
def lying_dicts(draw: st.DrawFn) -> tuple[Any, torch.Tensor]:
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    layers, blocks = draw(st.integers(1, 3)), draw(st.sampled_from([1, 3, 4]))
    views = layer_views(layout, layers, blocks, heads=1, tokens=draw(st.sampled_from([2, 4])), content=8)
    kind = draw(st.sampled_from(KINDS))
    return kind({f"model.layers.{i}.self_attn.attn": v for i, v in enumerate(views)}), views[0]


def _memory(registered: Any, layers: int) -> Any:
    """Per-layer start addresses in order (one tensor per layer), else the storages (BLOCKFIRST: one tensor)."""
    tensors = list(registered)
    if len(tensors) == layers:
        return [t.data_ptr() for t in tensors]
    return {t.untyped_storage().data_ptr() for t in tensors}


def _outcome(read: Any) -> Any:
    try:
        return read()
    except NotAddressableError:
        return "refused"


@settings(max_examples=60, deadline=None)
@given(case=lying_dicts())
def test_adapt_and_plan_of_a_vllm_dict_register_its_own_memory_or_refuse(case: tuple[Any, torch.Tensor]) -> None:
    kv, _ = case
    layers = list(dict.values(kv))
    own = _memory(layers, len(layers))  # each layer's own memory, in the dict's order
    a = _outcome(lambda: _memory(adapt(kv, kind="mla").kv_buffer, len(layers)))  # BLOCKFIRST layouts: plan() only
    p = _outcome(lambda: _memory(plan(kv, kind="mla").tensors, len(layers)))
    p_own = own if p == "refused" or isinstance(p, list) else {layers[0].untyped_storage().data_ptr()}
    assert a in ("refused", own), (type(kv).__name__, "adapt registers other memory")
    assert p in ("refused", p_own), (type(kv).__name__, "plan registers other memory")
    if type(kv) is dict:  # the control: a plain dict is registered, in its own memory
        assert p == p_own
