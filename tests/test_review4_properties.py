"""Property: on the fourth review's classes adapt() returns exactly the right elements, or an AdapterError.

Small example counts (two shared cores); the strategies say what a correct view aliases.
"""

from __future__ import annotations

from hypothesis import given, settings

from .pipeline.test_hostile_properties import _holds
from .strategies_review4 import hostile_keys, shifted_overlaps

FEW = settings(max_examples=40, deadline=None)


@FEW
@given(shifted_overlaps())
def test_layer_views_over_shared_bytes_on_the_general_path(case):
    _holds(case)


@FEW
@given(hostile_keys())
def test_dicts_with_hostile_or_non_str_keys(case):
    _holds(case)
