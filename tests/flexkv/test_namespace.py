"""The one FlexKV namespace component per request (flexkv/namespace.py): fixed length, one-to-one over tagged extras,
and refused for the block sizes it could align with. FlexKV's own hashing of it: tests/vllm/test_vllm_namespaces.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.flexkv.namespace import COMPONENT_LEN, TAG, alignment_problem, namespace_of

TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from('\x00"\\,[]:'), max_size=12)
VALUE = st.none() | st.integers(-(2**70), 2**70) | TEXT
EXTRA = st.tuples(st.sampled_from(["lora", "cache_salt", "extra_key"]), VALUE) | st.tuples(
    st.sampled_from(["lora"]), VALUE, VALUE
)
EXTRAS = st.lists(EXTRA, max_size=3)


def flexkv_own_key(components: list[str]) -> str:
    """What FlexKV hashes for a namespace (flexkv/common/block.py:17): its components joined with NUL."""
    return "\x00".join(components)


@given(EXTRAS, EXTRAS)
def test_different_extras_never_share_a_namespace(a, b):
    ns_a, ns_b = namespace_of(a), namespace_of(b)
    assert (ns_a == ns_b) == (a == b)
    assert (ns_a is None) == (not a)


@given(st.lists(EXTRA, min_size=1, max_size=3))
def test_a_namespace_is_one_ascii_component_of_the_fixed_length(extras):
    (component,) = namespace_of(extras) or [""]
    assert component.startswith(TAG) and len(component.encode()) == COMPONENT_LEN == len(component)


def test_negative_control_flexkvs_own_join_is_not_one_to_one():
    assert flexkv_own_key(["a\x00b"]) == flexkv_own_key(["a", "b"])
    assert namespace_of([("lora", "a\x00b")]) != namespace_of([("lora", "a"), ("cache_salt", "b")])


@pytest.mark.parametrize("bad", [("lora", 1.0), ("lora", True), ("lora", b"x"), ["lora", "x"], (), (1, "x")])
def test_an_extra_that_could_encode_ambiguously_is_refused(bad):
    with pytest.raises(TypeError):
        namespace_of([bad])


def test_a_str_subclass_is_refused_not_read_through_its_methods():
    class Lying(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    with pytest.raises(TypeError):
        namespace_of([("lora", Lying("x"))])


@pytest.mark.parametrize("tokens_per_block", [1, 61])
def test_block_sizes_that_divide_the_component_are_named(tokens_per_block):
    assert f"tokens_per_block={tokens_per_block}" in (alignment_problem(tokens_per_block) or "")


@given(st.integers(2, 4096).filter(lambda n: n != COMPONENT_LEN))
def test_every_other_block_size_carries_namespaces(tokens_per_block):
    assert alignment_problem(tokens_per_block) is None
