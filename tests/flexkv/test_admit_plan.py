"""Every plan's tensors pass the gate in FlexKV's call shape for the plan's mode (``admit_plan``), whichever way
in: a tensor under two layer names (KV sharing) says so once a plan, bytes shared otherwise are refused."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter import AdapterError
from flexkv_adapter.flexkv import plan

LOGGER = "flexkv_adapter.flexkv.checks"


@st.composite
def mla_layer_lists(draw):
    """Raw per-layer MLA tensors [blocks, tokens, width] (plan()'s as-is path): some layers the same tensor
    as an earlier one (KV sharing), some a view one block into another's bytes (never FlexKV-safe)."""
    layers = draw(st.integers(2, 5))
    backing = torch.arange(layers * 5 * 16 * 8, dtype=torch.float32).view(layers, 5 * 16, 8)
    tensors, fates = [], []
    for i in range(layers):
        fate = draw(st.sampled_from(["own", "alias", "shifted"])) if i else "own"
        if fate == "alias":
            tensors.append(tensors[draw(st.integers(0, i - 1))])
        elif fate == "shifted":  # rows 1.. of layer 0's bytes, spilling into layer 1's
            tensors.append(backing.view(-1, 8)[16 : 16 + 4 * 16].view(4, 16, 8))
        else:
            tensors.append(backing[i, : 4 * 16].view(4, 16, 8))
        fates.append(fate)
    return tensors, fates


@given(mla_layer_lists())
def test_as_is_layers_sharing_a_tensor_say_so_once_and_sharing_bytes_otherwise_is_refused(case):
    tensors, fates = case
    handler = _Lines()
    logging.getLogger(LOGGER).addHandler(handler)
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    try:
        if "shifted" in fates:
            with pytest.raises(AdapterError, match="share bytes"):
                plan(tensors, page_size=16)
            return
        p = plan(tensors, page_size=16)
    finally:
        logging.getLogger(LOGGER).removeHandler(handler)
    assert p.num_layer == len(tensors)
    assert len(handler.lines) == ("alias" in fates), handler.lines  # one line a plan, none without sharing
    if handler.lines:
        assert "KV sharing" in handler.lines[0]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
