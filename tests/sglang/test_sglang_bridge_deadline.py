"""A load past FlexKV's retrieve deadline: its slots are not reused until FlexKV's copy has ended.

FlexKV's ``retrieve_kv`` waits 30 s (connector.py:666); past it ``wait`` answers TIMEOUT while the copy
still runs (kvtask.py:1097-1104). SGLang 0.5.23 then frees the slots (flexkv_radix_cache.py:346-347) and
hands them to another request, whose KV FlexKV's running copy overwrites. SGLang's real FlexKVRadixCache,
pools and paged allocator over FlexKV 34ab141's real connector (``flexkv_faults``: the deadline).
"""

from __future__ import annotations

import contextlib

import torch

from . import flexkv_faults
from . import flexkv_standin as fk
from .flexkv_faults import manager, stored
from .radix_harness import Rig, read, write

faulty = flexkv_faults.faulty  # the fixture
IDS = list(range(1000, 1048))


def _timed_out_load_then_others(rig: Rig, faults) -> dict:
    stored(rig, "r1", IDS, seed=7)
    faults.get, faults.delay = "timeout", 3
    free_before = rig.alloc.available_size()
    loaded, _ = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    faults.get = ""
    # every free page goes to other requests, whose forward passes write their KV there
    others = rig.alloc.alloc(rig.alloc.available_size())
    write(rig.pool, others, seed=99)
    theirs = read(rig.pool, others)
    manager(rig).advance(faults.delay)  # FlexKV's late copy lands
    for _ in range(2):  # scheduler ticks: the copy's end is reported
        rig.cache.check_hicache_events()
    return {
        "loaded": loaded,
        "held while copying": free_before - len(others),
        "others intact": read(rig.pool, others) == theirs,
        "late copies": len(fk.calls("late copy")),
        "free after": rig.alloc.available_size(),
        "others": others,
    }


def test_slots_of_a_load_past_the_deadline_are_not_reused_until_the_copy_ends(faulty, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    out = _timed_out_load_then_others(rig, faulty)
    assert out["loaded"] == 0 and out["late copies"] == 1  # a miss for SGLang; FlexKV's copy did land later
    assert out["held while copying"] == len(IDS)  # quarantined, not handed out
    assert out["others intact"]  # the late copy wrote into the quarantined slots only
    assert out["free after"] == len(IDS)  # given back once FlexKV reported the end
    rig.alloc.free(out["others"])
    loaded, slots = rig.match_and_load(rig.request("r3", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and slots is not None  # FlexKV serves the prefix as before


def test_negative_control_without_the_quarantine_the_late_copy_overwrites_another_request(faulty, models, monkeypatch):
    from flexkv_adapter.integrations.sglang.outcomes import Quarantine

    monkeypatch.setattr(Quarantine, "withholding", lambda self, allocator: contextlib.nullcontext())
    rig = Rig(monkeypatch, models["llama"], "mha")
    out = _timed_out_load_then_others(rig, faulty)
    assert out["loaded"] == 0 and out["late copies"] == 1
    assert out["held while copying"] == 0 and not out["others intact"]


def test_a_load_that_ends_in_time_is_not_quarantined(faulty, models, monkeypatch):
    rig = Rig(monkeypatch, models["llama"], "mha")
    expected = stored(rig, "r1", IDS, seed=7)
    loaded, slots = rig.match_and_load(rig.request("r2", IDS, prompt=40, allocate=False))
    assert loaded == len(IDS) and read(rig.pool, slots) == expected
    assert not len(rig.cache.flexkv_connector.quarantine) and isinstance(slots, torch.Tensor)
    assert manager(rig).late == {}
