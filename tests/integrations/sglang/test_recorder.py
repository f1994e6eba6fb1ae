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

from flexkv_adapter.integrations.sglang.outcomes import Seen, waited
from flexkv_adapter.integrations.sglang.recorder import ObservedManager, _recorders

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
    exact = _recorders(observed, manager, observed.log)
    for name in observed.generic:  # as if the signatures had not been compared
        setattr(observed, name, exact[name])
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


class _Exact:
    """FlexKV 34ab141's signatures, answering with every argument as it arrived."""

    def get_match(self, token_ids, token_mask=None, cpu_only=False, namespace=None, swa_aware=False):
        return ("get_match", token_ids, token_mask, cpu_only, namespace, swa_aware)

    def put_match(self, token_ids, token_mask=None, namespace=None):
        return ("put_match", token_ids, token_mask, namespace)

    def launch(self, task_ids, slot_mappings, swa_slot_mappings=None, as_batch=False, layerwise_transfer=False,
               counter_id=0):  # fmt: skip
        return ("launch", task_ids, slot_mappings, swa_slot_mappings, as_batch, layerwise_transfer, counter_id)

    def wait(self, task_ids, timeout=20.0, completely=False):
        return ("wait", task_ids, timeout, completely)

    def try_wait(self, task_ids):
        return ("try_wait", task_ids)


_ARGUMENTS = {
    "get_match": {"token_ids": "t", "token_mask": "m", "cpu_only": "c", "namespace": "n", "swa_aware": "s"},
    "put_match": {"token_ids": "t", "token_mask": "m", "namespace": "n"},
    "launch": {
        "task_ids": "i",
        "slot_mappings": "m",
        "swa_slot_mappings": "w",
        "as_batch": "b",
        "layerwise_transfer": "l",
        "counter_id": "c",
    },
    "wait": {"task_ids": "i", "timeout": "t", "completely": "c"},
    "try_wait": {"task_ids": "i"},
}


@pytest.mark.parametrize("name", METHODS)
@given(given_count=st.integers(1, 6), by_keyword=st.booleans())
def test_every_argument_reaches_the_manager_where_the_caller_put_it(name, given_count, by_keyword):
    """Each leading run of a method's parameters, by position or by keyword, arrives as the manager itself would
    take it, on the positional path (FlexKV's signatures) and on the generic one (any other)."""
    names = list(_ARGUMENTS[name])[: max(given_count, 2 if name == "launch" else 1)]  # what it requires, at least
    values = [_ARGUMENTS[name][n] for n in names]
    direct = getattr(_Exact(), name)

    class _Other(_Exact):  # the same methods behind *args/**kwargs: the generic path
        pass

    setattr(_Other, name, lambda self, *a, _name=name, **k: getattr(_Exact, _name)(self, *a, **k))
    for manager in (_Exact(), _Other()):
        observed = ObservedManager(manager)
        assert (name in observed.generic) == isinstance(manager, _Other)
        call = getattr(observed, name)
        got = call(**dict(zip(names, values, strict=True))) if by_keyword else call(*values)
        assert got == (direct(**dict(zip(names, values, strict=True))) if by_keyword else direct(*values))


class _EqualButNot(_Exact):
    """Defaults equal to FlexKV's under ==, of another type (as a later FlexKV or a stand-in might declare them)."""

    def wait(self, task_ids, timeout=20, completely=0):
        return ("wait", task_ids, timeout, completely)

    def launch(self, task_ids, slot_mappings, swa_slot_mappings=None, as_batch=0, layerwise_transfer=False,
               counter_id=False):  # fmt: skip
        return ("launch", task_ids, slot_mappings, swa_slot_mappings, as_batch, layerwise_transfer, counter_id)


def test_defaults_equal_in_value_but_not_in_type_take_the_generic_path():
    manager = _EqualButNot()
    observed = ObservedManager(manager)
    assert observed.generic == ("launch", "wait")
    got = observed.wait([1])
    assert got == ("wait", [1], 20, 0) and type(got[2]) is int and type(got[3]) is int
    got = observed.launch(task_ids=[1], slot_mappings=["s"])
    assert type(got[4]) is int and type(got[6]) is bool


def test_a_default_that_cannot_be_compared_takes_the_generic_path():
    class _Unequal:
        def __eq__(self, other):
            raise RuntimeError("no comparison")

        __hash__ = None

    odd = _Unequal()

    class _Odd(_Exact):
        def wait(self, task_ids, timeout=odd, completely=False):
            return ("wait", task_ids, timeout, completely)

    observed = ObservedManager(_Odd())
    assert observed.generic == ("wait",) and observed.wait([1])[2] is odd


def test_a_decorated_method_is_judged_by_the_wrapper_that_runs_not_by_what_it_wraps():
    import functools

    def keywords_only(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            if args:
                raise TypeError("call with keywords")
            return fn(self, **kwargs)

        return wrapper

    class _Decorated(_Exact):
        launch = keywords_only(_Exact.launch)

    observed = ObservedManager(_Decorated())
    assert observed.generic == ("launch",)
    assert observed.launch(task_ids=[1], slot_mappings=["s"])[:3] == ("launch", [1], ["s"])
    assert Seen(observed.log).launched == [1]
