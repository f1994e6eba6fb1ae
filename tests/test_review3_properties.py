"""Property: on the third review's classes adapt() returns exactly the right elements, or an AdapterError.

Modest example counts (the machine is shared); each strategy says what a correct view aliases.
"""

from __future__ import annotations

from hypothesis import given, settings

from .pipeline.test_hostile_properties import _holds
from .strategies_review3 import (
    copying_getters,
    metadata_numbers,
    nested_containers,
    shared_byte_dicts,
    unlabelled_entries,
)

FEW = settings(max_examples=80, deadline=None)


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
