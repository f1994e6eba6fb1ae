"""The SGLang bridge's recorder of FlexKV's KVManager: every call passes through unchanged, by whichever path.

A method the manager declares exactly as FlexKV 34ab141's KVManager does is recorded by position; any other
signature through the generic pass-through, which forwards what the caller passed. Both must answer and record
alike, and the positional path must never be taken where a default differs.
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.integrations.sglang_outcomes import Seen, waited
from flexkv_adapter.integrations.sglang_recorder import ObservedManager

METHODS = ("get_match", "put_match", "launch", "wait", "try_wait")


class _Recorded:
    """A KVManager of any signature whose calls answer as told, recording what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []
        self.answers: list[object] = []

    def _answer(self, name: str, **got: object) -> object:
        self.calls.append((name, got))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def get_match(self, *args: object, **kwargs: object) -> object:
        return self._answer("get_match", args=args, kwargs=kwargs)

    def put_match(self, *args: object, **kwargs: object) -> object:
        return self._answer("put_match", args=args, kwargs=kwargs)

    def launch(self, *args: object, **kwargs: object) -> object:
        return self._answer("launch", args=args, kwargs=kwargs)

    def wait(self, *args: object, **kwargs: object) -> object:
        return self._answer("wait", args=args, kwargs=kwargs)

    def try_wait(self, *args: object, **kwargs: object) -> object:
        return self._answer("try_wait", args=args, kwargs=kwargs)


class _Recorded34ab141(_Recorded):
    """The same, declared as FlexKV 34ab141's KVManager (kvmanager.py:199-373)."""

    def get_match(self, token_ids, token_mask=None, cpu_only=False, namespace=None, swa_aware=False):
        return self._answer("get_match", token_ids=token_ids, token_mask=token_mask, swa_aware=swa_aware)

    def put_match(self, token_ids, token_mask=None, namespace=None):
        return self._answer("put_match", token_ids=token_ids, token_mask=token_mask)

    def launch(self, task_ids, slot_mappings, swa_slot_mappings=None, as_batch=False, layerwise_transfer=False,
               counter_id=0):  # fmt: skip
        return self._answer("launch", task_ids=task_ids, slot_mappings=slot_mappings, as_batch=as_batch)

    def wait(self, task_ids, timeout=20.0, completely=False):
        return self._answer("wait", task_ids=task_ids, timeout=timeout, completely=completely)

    def try_wait(self, task_ids):
        return self._answer("try_wait", task_ids=task_ids)


class _OtherDefaults(_Recorded34ab141):
    """FlexKV 34ab141's names, with defaults of its own (as a later FlexKV might change them)."""

    def launch(self, task_ids, slot_mappings, swa_slot_mappings=None, as_batch=True, layerwise_transfer=False,
               counter_id=0):  # fmt: skip
        return self._answer("launch", task_ids=task_ids, slot_mappings=slot_mappings, as_batch=as_batch)

    def wait(self, task_ids, timeout=5.0, completely=False):
        return self._answer("wait", task_ids=task_ids, timeout=timeout, completely=completely)


def test_flexkv_34ab141_signatures_are_recorded_by_position_and_any_other_generically():
    assert ObservedManager(_Recorded34ab141()).generic == ()
    assert ObservedManager(_Recorded()).generic == METHODS
    assert ObservedManager(_OtherDefaults()).generic == ("launch", "wait")


def test_a_default_of_the_managers_own_reaches_it_when_the_caller_leaves_it_out():
    manager = _OtherDefaults()
    observed = ObservedManager(manager)
    manager.answers += [[1], {}]
    observed.launch(task_ids=[1], slot_mappings=["slots"])
    observed.wait([1])
    assert manager.calls == [("launch", {"task_ids": [1], "slot_mappings": ["slots"], "as_batch": True}),
                             ("wait", {"task_ids": [1], "timeout": 5.0, "completely": False})]  # fmt: skip


def test_negative_control_the_positional_path_on_other_defaults_replaces_the_managers_own():
    manager = _OtherDefaults()
    observed = ObservedManager(manager)
    for name in observed.generic:  # as if the signatures had not been compared
        del observed.__dict__[name]
    manager.answers += [[1]]
    observed.launch(task_ids=[1], slot_mappings=["slots"])
    assert manager.calls[-1][1]["as_batch"] is False


_STATUS = st.sampled_from(["success", "failed", "timeout", "cancelled", "unready"])
_IDS = st.one_of(st.integers(0, 9), st.lists(st.integers(0, 9), max_size=3))
_CALL = st.one_of(
    st.tuples(st.sampled_from(["get_match", "put_match"]), st.one_of(st.integers(-2, 9), st.none()), st.booleans()),
    st.tuples(st.just("launch"), _IDS, st.booleans()),
    st.tuples(st.just("wait"), st.dictionaries(st.integers(0, 9), _STATUS, max_size=3), st.booleans()),
    st.tuples(st.just("try_wait"), st.dictionaries(st.integers(0, 9), _STATUS, max_size=3), st.booleans()),
)


@pytest.mark.parametrize("kind", [_Recorded, _Recorded34ab141, _OtherDefaults])
@given(calls=st.lists(_CALL, max_size=8))
def test_the_observed_manager_passes_every_call_through_unchanged_and_records_what_the_bridge_reads(kind, calls):
    """What FlexKV's connector gets back is the manager's own answer (or its exception); the record holds the
    task ids created (valid ones only), launched (one id or a list, positional or keyword, only when launch
    returned) and each wait's responses, and the last error launch or wait raised (parsed by Seen from the log);
    try_wait (the store poll) records nothing."""
    manager = kind()
    observed = ObservedManager(manager)
    created: list[int] = []
    launched: list[int] = []
    waits: dict[int, str] = {}
    error = None
    for name, value, fails in calls:
        boom = BrokenPipeError(name)
        if name in ("get_match", "put_match"):
            answer: object = None if value is None else (value, "mask")
            manager.answers.append(boom if fails else answer)
            try:
                got = getattr(observed, name)(token_ids=[1, 2], token_mask=None)
            except BrokenPipeError as exc:
                assert fails and exc is boom
                continue
            assert got is answer and not fails
            created += [value] if value is not None and value >= 0 else []
        elif name == "launch":
            manager.answers.append(boom if fails else [7])
            positional = isinstance(value, int)  # one id passed positionally, a list by keyword
            try:
                got = (
                    observed.launch(value, ["slots"])
                    if positional
                    else observed.launch(task_ids=value, slot_mappings=["s"])
                )
            except BrokenPipeError as exc:
                assert fails and exc is boom
                error = boom
                continue
            assert got == [7]
            launched += [value] if positional else value
        else:
            responses = {t: types.SimpleNamespace(status=s) for t, s in value.items()}
            manager.answers.append(boom if fails else responses)
            try:
                got = (
                    observed.wait(list(value), timeout=1.0)
                    if name == "wait"
                    else observed.try_wait(task_ids=list(value))
                )
            except BrokenPipeError as exc:
                assert fails and exc is boom
                error = boom if name == "wait" else error
                continue
            assert got is responses
            waits.update(value if name == "wait" else {})
        assert manager.calls[-1][0] == name
    seen = Seen(observed.log)
    assert seen.created == created and seen.launched == launched and seen.manager_error is error
    assert {t: waited(observed.log, t) for t in range(10)} == {t: waits.get(t, "") for t in range(10)}
