"""Property: however a pool hides its layers, adapt() returns exactly the right elements, or an AdapterError.

Containers nested in containers, metadata in every numeric type, getters that copy (or return fresh views),
vLLM dicts with distinct views over shared bytes or true KV sharing, dict entries without a layer index,
layer views over shared bytes on the general path, and dicts with hostile or non-str keys. Modest example
counts (the machine is shared); each strategy says what a correct view aliases.
"""

from __future__ import annotations

from hypothesis import given, settings

from ..strategies.containers import copying_getters, metadata_numbers, nested_containers
from ..strategies.pools import hostile_keys, shifted_overlaps
from ..strategies.vllm import shared_byte_dicts, unlabelled_entries
from .test_hostile_properties import _holds

FEW = settings(max_examples=80, deadline=None)
FEWER = settings(max_examples=40, deadline=None)


@FEW
@given(nested_containers())
def test_containers_nested_in_containers(case):
    _holds(case)


@FEW
@given(metadata_numbers())
def test_metadata_in_every_numeric_type(case):
    _holds(case)


@FEW
@given(copying_getters())
def test_getters_that_copy_or_return_fresh_views(case):
    _holds(case)


@FEW
@given(shared_byte_dicts())
def test_distinct_views_over_shared_bytes_and_kv_sharing(case):
    _holds(case)


@FEW
@given(unlabelled_entries())
def test_unlabelled_dict_entries(case):
    _holds(case)


@FEWER
@given(shifted_overlaps())
def test_layer_views_over_shared_bytes_on_the_general_path(case):
    _holds(case)


@FEWER
@given(hostile_keys())
def test_dicts_with_hostile_or_non_str_keys(case):
    _holds(case)
