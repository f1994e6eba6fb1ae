"""Which requests and radix keys carry a FlexKV namespace (``namespaces.namespaced``), and how the start-up check
finds the namespace hook run inside the lookup hook (``resolve.hooked_by``)."""

from __future__ import annotations

import types
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.integrations.sglang.namespaces import namespaced


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (SimpleNamespace(extra_key=None, cache_salt=None), False),
        (SimpleNamespace(extra_key="lora-1", cache_salt=None), True),
        (SimpleNamespace(extra_key=None, cache_salt="salt"), True),
        (SimpleNamespace(multimodal_inputs=object()), True),
        (SimpleNamespace(multimodal_inputs=None), False),
        (SimpleNamespace(), False),
        (None, False),
    ],
)
def test_namespaced(obj, expected):
    assert namespaced(obj) is expected


class _Key:
    """SGLang's RadixKey's shape: slots for the two namespace fields only."""

    __slots__ = ("cache_salt", "extra_key", "token_ids")

    def __init__(self, extra_key: object = None, cache_salt: object = None) -> None:
        self.token_ids, self.extra_key, self.cache_salt = [1], extra_key, cache_salt


class _KeyWithLora(_Key):
    __slots__ = ("lora_id",)


class _KeyAnswering(_Key):
    __slots__ = ()

    def __getattr__(self, name: str) -> object:
        return "answered"


class _KeyWithDict(_Key):
    pass


class _KeyWithDescriptor(_Key):
    """A descriptor ``hasattr`` on the class cannot see (its class-level read raises AttributeError)."""

    __slots__ = ()
    lora_id = types.DynamicClassAttribute(lambda self: "lora-A")


class _Meta(type):
    def __eq__(cls, other: object) -> bool:
        return True

    def __hash__(cls) -> int:
        return hash(_Key)


class _KeyOfMeta(metaclass=_Meta):
    __slots__ = ("cache_salt", "extra_key", "lora_id")

    def __init__(self, lora_id: object) -> None:
        self.extra_key, self.cache_salt, self.lora_id = None, None, lora_id


def test_namespaced_reads_every_field_where_a_class_attribute_or_metaclass_could_hide_one():
    """A descriptor only reading the instance shows, or a metaclass equal to SGLang's key type in a cache, must not
    make a LoRA request read as plain (it would share KV across tenants)."""
    assert namespaced(_Key()) is False  # cached as the two-field type first
    assert namespaced(_KeyWithDescriptor()) is True
    assert namespaced(_KeyOfMeta("lora-A")) is True


@given(extra=st.one_of(st.none(), st.text(max_size=3)), salt=st.one_of(st.none(), st.text(max_size=3)),
       lora=st.one_of(st.none(), st.text(max_size=3)), mm=st.one_of(st.none(), st.just(object())))  # fmt: skip
def test_namespaced_reads_every_field_a_key_type_can_hold(extra, salt, lora, mm):
    """A slotted key that can hold only extra_key and cache_salt is read for those; any type that can hold more
    (a slot, a __dict__, a __getattr__ of its own) is read for all four, as a request is."""
    plain = extra is not None or bool(salt)
    assert namespaced(_Key(extra, salt)) is plain
    with_lora = _KeyWithLora(extra, salt)
    with_lora.lora_id = lora
    assert namespaced(with_lora) is (plain or lora is not None)
    assert namespaced(_KeyAnswering(extra, salt)) is (plain or True)  # its __getattr__ answers a multimodal input
    with_dict = _KeyWithDict(extra, salt)
    with_dict.multimodal_inputs = mm
    assert namespaced(with_dict) is (plain or mm is not None)


def test_hooked_by_looks_one_level_into_a_hooks_closure_and_never_into_other_objects():
    """The lookup hook runs the namespace hook inside it: the start-up check must see both, and an object that
    answers every attribute (a proxy) in a closure must not make the check raise or claim a module."""
    from flexkv_adapter.integrations.sglang import lookups, namespaces
    from flexkv_adapter.integrations.sglang.resolve import hooked_by

    class Proxy:
        def __getattr__(self, name: str) -> object:
            return "anything"

    def wrap(hook: object, original: object) -> object:
        def wrapper(*args: object, **kwargs: object) -> object:
            return hook, original

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    def original() -> None: ...

    both = wrap(lookups.match_hook(namespaces.match_prefix), original)
    alone = wrap(lookups.match_hook(None), original)
    assert hooked_by(both, lookups.__name__) and hooked_by(both, namespaces.__name__)
    assert hooked_by(alone, lookups.__name__) and not hooked_by(alone, namespaces.__name__)
    assert not hooked_by(wrap(Proxy(), original), namespaces.__name__)
