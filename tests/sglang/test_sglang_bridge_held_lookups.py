"""A FlexKV lookup held for a request that will not load it is released: FlexKV keeps no get task and pins no block.

SGLang 0.5.23's ``FlexKVRadixCache`` holds FlexKV's get task from a hit in ``match_prefix`` until
``init_load_back``. A request matched again once the prefix is on the device returns early
(flexkv_radix_cache.py:196-197) and is admitted without a load, and ``on_release`` (:378-380) releases
nothing: FlexKV kept the get task, never launched or cancelled, with its matched CPU blocks locked, until the
next flush. Under LPM ``calc_priority`` matches B, C and D, which share a prefix, before B loads it; under FCFS C
is matched, not admitted (NO_TOKEN), and matched again after another request put the prefix on the device.

SGLang's real scheduling code (``Req``, ``SchedulePolicy.calc_priority``, ``PrefillAdder.add_one_req``,
``release_kv_cache``, ``release_req``) over its real radix cache, pools and allocator; behind the bridge FlexKV's
own connector, KVManager, task engine, radix index and transfer processes. What FlexKV holds is read from its task
table and from its own eviction. Negative control (the same FlexKV, started once): without the plugin's hooks on
``match_prefix`` and ``on_release`` FlexKV keeps the get tasks and cannot evict the prefix's 3 blocks; aborting
the same requests (SGLang's own release) frees all 3.
"""

from __future__ import annotations

import inspect
from typing import Any

from flexkv_adapter.integrations.sglang import lookups

from . import test_sglang_bridge_flexkv_kvmanager as real_kvmanager
from . import test_sglang_bridge_retract as retract
from .radix_harness import Rig
from .real_flexkv import needs_flexkv
from .scheduling import (
    abort,
    allocate,
    blocks_flexkv_cannot_evict,
    finish,
    flush,
    never_launched_gets,
    new_req,
    schedule,
    settle,
    stored_and_evicted,
)

pytestmark = needs_flexkv
flexkv = real_kvmanager.flexkv  # the fixture: FlexKV's real KVManager, task engine and transfer processes
published = retract.published  # the fixture: SGLang's server config, which release_req reads
PREFIX = list(range(1000, 1048))  # 3 FlexKV blocks of 16 tokens


def _own(i: int) -> list[int]:
    return list(range(2000 + 16 * i, 2016 + 16 * i))


def _flexkv_holds(rig: Rig) -> dict[str, int]:
    """What FlexKV keeps once every request is done: get tasks never launched nor cancelled, blocks it cannot evict."""
    settle(rig)
    return {"get tasks": len(never_launched_gets(rig)), "pinned blocks": blocks_flexkv_cannot_evict(rig)}


def _shared_prefix_under_lpm(rig: Rig, end: str = "finish") -> dict[str, Any]:
    """A's prompt is in FlexKV only; B, C and D share it. LPM matches all three (each holds a FlexKV lookup),
    then admits B, which loads the prefix, and C and D on the device copy without a load. ``end``: how C and D
    end (finish, abort, or C finishes and D is retracted)."""
    stored_and_evicted(rig, "a", PREFIX, seed=7)
    waiting = [new_req(rid, PREFIX + _own(i)) for i, rid in enumerate("bcd")]
    admitted, _ = schedule(rig, "lpm", waiting)
    out: dict[str, Any] = {
        "admitted": [(r.rid, r.host_loaded_length, r.prefix_len) for r in admitted],
        "held while running": len(never_launched_gets(rig)),
    }
    for i, req in enumerate(admitted):
        allocate(rig, req, seed=10 + i)
    finish(rig, admitted[0])
    for req in admitted[1:]:
        if end == "abort":
            abort(rig, req)
        elif end == "retract" and req.rid == "d":
            _retract(rig, req)
        else:
            finish(rig, req)
    return out | _flexkv_holds(rig)


def _retract(rig: Rig, req: Any) -> None:
    """ScheduleBatch.release_req as retract_decode calls it: release_kv_cache(..., checkpoint=False)."""
    from sglang.srt.managers.schedule_batch import release_req

    assert release_req(req=req, remaing_req_count=1, req_to_token_pool=rig.r2t, token_to_kv_pool_allocator=rig.alloc,
                       tree_cache=rig.cache, hisparse_coordinator=None)  # fmt: skip


def _no_token_then_on_the_device(rig: Rig) -> dict[str, Any]:
    """FCFS: R computes the prefix itself while A's copy of it goes to FlexKV and leaves the device. C hits FlexKV
    but finds no room (NO_TOKEN); R finishes, its prefix enters the device tree, and C is admitted on it."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    r = new_req("r", PREFIX + _own(5))
    assert schedule(rig, "fcfs", [r])[0] == [r] and r.prefix_len == 0  # FlexKV is empty yet
    allocate(rig, r, seed=1)
    stored_and_evicted(rig, "a", PREFIX, seed=7)
    others = rig.alloc.alloc(rig.alloc.available_size())  # the running requests hold the rest of the pool
    c = new_req("c", PREFIX + _own(1))
    admitted, verdict = schedule(rig, "fcfs", [c])
    assert (admitted, verdict, c.host_hit_length) == ([], AddReqResult.NO_TOKEN, len(PREFIX))  # held, not admitted
    finish(rig, r)
    rig.alloc.free(others)
    settle(rig)
    admitted, _ = schedule(rig, "fcfs", [c])
    out: dict[str, Any] = {"again": ([q.rid for q in admitted], c.host_hit_length, c.prefix_len)}
    allocate(rig, c, seed=3)
    finish(rig, c)
    return out | _flexkv_holds(rig)


ADMITTED = [("b", len(PREFIX), len(PREFIX)), ("c", 0, len(PREFIX)), ("d", 0, len(PREFIX))]
ON_DEVICE = (["c"], 0, len(PREFIX))


def _from_on_release_only(monkeypatch: Any) -> None:
    """The hook on on_release alone: the one on match_prefix left out."""
    release = lookups.release_held

    def from_on_release(radix: Any, handle: Any) -> None:
        if inspect.stack()[1].function == lookups.after_on_release.__name__:
            release(radix, handle)

    monkeypatch.setattr(lookups, "release_held", from_on_release)


def test_requests_admitted_on_a_prefix_another_request_loaded_leave_flexkv_nothing_held(
    flexkv, published, models, monkeypatch
):
    _, rigs = flexkv
    rig = Rig(monkeypatch, models["llama"], "mha")  # FlexKV starts here (~20 s), once for every case below
    rigs.append(rig)
    lpm = _shared_prefix_under_lpm(rig)
    assert lpm["admitted"] == ADMITTED  # B loaded the prefix; C and D found it on the device
    assert lpm["held while running"] == 0  # released at C's and D's match, not held until they end
    assert (lpm["get tasks"], lpm["pinned blocks"]) == (0, 0)  # FlexKV's eviction frees the prefix's 3 blocks
    flush(rig)
    fcfs = _no_token_then_on_the_device(rig)
    assert fcfs["again"] == ON_DEVICE
    assert (fcfs["get tasks"], fcfs["pinned blocks"]) == (0, 0)
    flush(rig)
    # a request released with a lookup still held releases it: C finished (checkpointed), D retracted (not
    # checkpointed, where SGLang drops only the load marker)
    with monkeypatch.context() as patch:
        _from_on_release_only(patch)
        ended = _shared_prefix_under_lpm(rig, end="retract")
    assert ended["admitted"] == ADMITTED and ended["held while running"] == 2  # held while C and D ran...
    assert (ended["get tasks"], ended["pinned blocks"]) == (0, 0)  # ...released when they ended
    flush(rig)

    # negative control: SGLang 0.5.23 as shipped (no hook releases anything)
    monkeypatch.setattr(lookups, "release_held", lambda radix, handle: None)
    lpm = _shared_prefix_under_lpm(rig)
    assert lpm["admitted"] == ADMITTED
    assert (lpm["get tasks"], lpm["pinned blocks"]) == (2, 3)  # C's and D's: FlexKV frees 0 of the prefix's 3 blocks
    flush(rig)
    aborted = _shared_prefix_under_lpm(rig, end="abort")  # SGLang's abort path releases what it held
    assert (aborted["get tasks"], aborted["pinned blocks"]) == (0, 0)  # 3 of 3 freed
    flush(rig)
    fcfs = _no_token_then_on_the_device(rig)
    assert fcfs["again"] == ON_DEVICE
    assert (fcfs["get tasks"], fcfs["pinned blocks"]) == (1, 3)
