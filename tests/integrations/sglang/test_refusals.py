"""Every server option the SGLang table refuses is refused at start, on the bridge's and the in-tree path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flexkv_adapter.integrations.sglang.refusals import option_refusal, start_refusal
from flexkv_adapter.model.sglang_features import OPTION, SGLANG

REFUSED = [r for r in SGLANG.of_kind(OPTION) if r.verdict == "refused"]
SERVED = [r for r in SGLANG.of_kind(OPTION) if r.verdict == "served"]


@pytest.mark.parametrize("row", REFUSED, ids=[r.name for r in REFUSED])
def test_each_refused_option_is_refused_at_start_naming_its_setting(row):
    setting, value = row.trigger
    args = SimpleNamespace(**{setting: value})
    refusal = start_refusal(None, args)
    assert refusal is not None and setting in str(refusal)
    table = option_refusal(args)  # the table's own wording, which the in-tree path raises too
    assert table is not None and row.reason in str(table) and row.instead in str(table) and SGLANG.doc in str(table)


@pytest.mark.parametrize("row", REFUSED, ids=[r.name for r in REFUSED])
def test_negative_control_the_same_setting_off_is_not_refused(row):
    setting, value = row.trigger
    off = False if isinstance(value, bool) else 1 if isinstance(value, int) else None
    assert start_refusal(None, SimpleNamespace(**{setting: off})) is None
    assert start_refusal(None, SimpleNamespace()) is None


def test_every_refused_option_says_which_setting_turns_it_on():
    assert REFUSED and all(r.trigger for r in REFUSED)
    assert all(not r.trigger for r in SERVED)
