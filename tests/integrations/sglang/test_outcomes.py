"""The SGLang bridge's quarantine gives slots back as SGLang handed them: same device, same dtype, a copy."""

from __future__ import annotations

import types

import torch
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.integrations.sglang.outcomes import (
    QUARANTINE,
    Agreement,
    Quarantine,
    load_outcome,
)


class _Allocator:
    def __init__(self) -> None:
        self.freed: list[torch.Tensor] = []

    def free(self, free_index: torch.Tensor) -> None:
        self.freed.append(free_index)


class _Manager:
    def __init__(self) -> None:
        self.ended: set[int] = set()

    def try_wait(self, tids: list[int]) -> dict[int, object]:
        return {t: type("Response", (), {"status": "success"})() for t in tids if t in self.ended}


def test_quarantined_slots_are_freed_in_the_allocators_dtype_and_device_once_flexkv_ends():
    quarantine, allocator, manager = Quarantine(Agreement(None, False)), _Allocator(), _Manager()
    slots = torch.tensor([7, 8, 9], dtype=torch.int32)
    quarantine.add(5, slots)
    slots.fill_(0)  # SGLang reuses its tensor: the quarantine kept its own copy
    with quarantine.withholding(allocator):
        allocator.free(torch.tensor([1, 7, 8, 9], dtype=torch.int32))
    assert [t.tolist() for t in allocator.freed] == [[1]]  # the quarantined ones withheld
    assert quarantine.poll(manager, leader=True) == 0 and len(quarantine) == 1  # FlexKV still copying
    manager.ended.add(5)
    assert quarantine.poll(manager, leader=True) == 1 and len(quarantine) == 0
    given_back = allocator.freed[-1]
    # SGLang's allocators concatenate what free() gets with their free lists on the KV device:
    # a CPU int64 copy of CUDA int32 slots made torch.cat raise in the scheduler loop
    assert (given_back.dtype, given_back.device, given_back.tolist()) == (torch.int32, slots.device, [7, 8, 9])


class _Answering:
    """A KVManager whose try_wait answers ``answer`` (or raises it)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def try_wait(self, tids: list[int]) -> object:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class _Counting(Agreement):
    """An agreement that counts its collectives (every rank must enter each one the leader enters)."""

    def __init__(self) -> None:
        super().__init__(None, False)
        self.entered = 0

    def min(self, values: list[int]) -> list[int]:
        self.entered += 1
        return values


_ANSWERS = st.one_of(
    st.none(),
    st.lists(st.integers()),
    st.integers(),
    st.text(max_size=3),
    st.just({5: object()}),
    st.just(RuntimeError("FlexKV's server is gone")),
    st.just({5: types.SimpleNamespace(status=types.SimpleNamespace(value="RUNNING"))}),
)


@given(_ANSWERS)
def test_a_poll_enters_the_collective_and_keeps_the_slots_whatever_flexkv_answers(answer):
    """A try_wait answer the leader cannot read (not a dict, no status, raised) keeps the slots held, and the
    leader still enters the agreement its other ranks wait in."""
    agreement, allocator = _Counting(), _Allocator()
    quarantine = Quarantine(agreement)
    quarantine.attach(allocator)
    quarantine.add(5, torch.tensor([7, 8]))
    assert quarantine.poll(_Answering(answer), leader=True) == 0
    assert agreement.entered == 1 and len(quarantine) == 1 and allocator.freed == []
    ended = {5: types.SimpleNamespace(status="SUCCESS")}
    assert quarantine.poll(_Answering(ended), leader=True) == 1 and [t.tolist() for t in allocator.freed] == [[7, 8]]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 15), min_size=1, max_size=4)),  # a load quarantined
        st.tuples(st.just("free"), st.lists(st.integers(0, 15), max_size=6)),  # SGLang frees these
        st.tuples(st.just("end"), st.integers(0, 10)),  # FlexKV reports a held task ended
    ),
    max_size=12,
)


@given(OPS, st.booleans(), st.booleans())
def test_inside_withholding_no_quarantined_slot_is_freed_and_the_allocator_is_left_as_it_was(calls, own_free, before):
    """One init_load_back: loads quarantined during it (the filter goes on then) and before it are withheld;
    after it the allocator's free is its own again (an instance attribute only if it had one)."""
    quarantine, allocator, manager = Quarantine(Agreement(None, False)), _Allocator(), _Manager()
    if own_free:
        allocator.free = allocator.free  # an instance attribute, as a patched allocator has
    held: list[tuple[int, list[int]]] = []
    if before:  # a load quarantined by an earlier init_load_back
        quarantine.add(100, torch.tensor([3]))
        held.append((100, [3]))
    with quarantine.withholding(allocator):
        for step, (op, arg) in enumerate(calls):
            if op == "add":  # slots SGLang can hand out: none still withheld
                fresh = [s for s in dict.fromkeys(arg) if all(s not in slots for _, slots in held)]
                if fresh:
                    quarantine.add(step, torch.tensor(fresh))
                    held.append((step, fresh))
            elif op == "free":
                before = len(allocator.freed)
                allocator.free(torch.tensor(arg, dtype=torch.int64))
                got = [s for t in allocator.freed[before:] for s in t.tolist()]
                withheld = {s for _, slots in held for s in slots}
                assert got == [s for s in arg if s not in withheld]
            elif held:
                tid, _ = held.pop(arg % len(held))
                manager.ended.add(tid)
                assert quarantine.poll(manager, leader=True) == 1  # its slots go back through the same free
    assert ("free" in vars(allocator)) == own_free and allocator.free.__func__ is _Allocator.free


class _Slotted:
    __slots__ = ("freed",)

    def __init__(self) -> None:
        self.freed: list[torch.Tensor] = []

    def free(self, free_index: torch.Tensor) -> None:
        self.freed.append(free_index)


@given(st.lists(st.integers(0, 13), min_size=1, max_size=4), st.booleans(), st.booleans(), st.integers(0, 3))
def test_the_filter_is_taken_off_the_allocator_it_went_on_and_a_kept_reference_still_frees(slots, own, early, at):
    """A refused second allocator inside changes nothing; after the end the allocator's free is its own, and a
    reference to the filtered free that SGLang kept still reaches it (withholding what FlexKV may still write)."""
    from flexkv_adapter.errors import AdapterError

    quarantine, allocator, other = Quarantine(Agreement(None, False)), _Allocator(), _Allocator()
    if own:
        allocator.free = allocator.free
    if early:
        quarantine.add(1, torch.tensor(slots))
    kept = []
    with quarantine.withholding(allocator):
        for step in range(4):
            if step == at:
                quarantine.add(2, torch.tensor([15]))  # inside: the filter goes on now if not already
            try:
                with quarantine.withholding(other):
                    raise AssertionError("a second allocator inside was accepted")
            except AdapterError:
                pass
            with quarantine.withholding(allocator):  # the same allocator again: nested, fine
                kept.append((allocator.free, early or step >= at))  # filtered once anything is withheld
    assert ("free" in vars(allocator)) == own and allocator.free.__func__ is _Allocator.free
    assert "free" not in vars(other)
    for free, filtered in kept:  # each reference ends in the allocator's own free; a filtered one still filters
        allocator.freed.clear()
        free(torch.tensor([14, 15]))
        assert [t.tolist() for t in allocator.freed] == ([[14]] if filtered else [[14, 15]])  # 15: quarantined


def test_an_allocator_whose_free_cannot_be_replaced_is_refused_before_anything_changes():
    from flexkv_adapter.errors import AdapterError

    quarantine = Quarantine(Agreement(None, False))
    quarantine.add(1, torch.tensor([3]))
    try:
        quarantine.withholding(_Slotted())
    except AdapterError as exc:
        assert "no __dict__" in str(exc)
    else:
        raise AssertionError("a slotted allocator was accepted")
    allocator = _Allocator()
    with quarantine.withholding(allocator):  # the refusal left no depth behind: this one ends clean
        allocator.free(torch.tensor([3, 4]))
    assert [t.tolist() for t in allocator.freed] == [[4]] and "free" not in vars(allocator)


def test_load_outcome_reads_the_recorded_wait_response_of_its_own_task():
    """A load counts only when its own task's wait answered success; a launched task with no end is quarantined."""
    log = [("launched", [3, 4]), ("waited", {4: types.SimpleNamespace(status="success")})]
    assert load_outcome(True, log, 4, 16, 16, False) == 16
    assert load_outcome(True, log, 3, 16, 16, False) == QUARANTINE  # launched, never answered
    log.append(("waited", {3: types.SimpleNamespace(status=types.SimpleNamespace(value="FAILED"))}))
    assert load_outcome(True, log, 3, 16, 16, False) == 0
    assert load_outcome(True, log, 4, 16, 15, False) == 0  # fewer slots than asked
    log.append(("waited", {4: types.SimpleNamespace(status="timeout")}))  # the last answer for a task is its status
    assert load_outcome(True, log, 4, 16, 16, False) == QUARANTINE
