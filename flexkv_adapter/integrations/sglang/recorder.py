"""The leader's FlexKV KVManager, unchanged, logging what each call returned or raised for the SGLang bridge.

FlexKV's connector makes four or five KVManager calls per request (lookup, load, store), and the bridge's
rules (:mod:`.outcomes`) read what they answered. A pass-through with ``*args, **kwargs`` packs and
unpacks FlexKV's keywords on every call (about 0.8 us each, most of the bridge's cost per request), so each
method that the manager declares exactly as FlexKV 34ab141's KVManager does (kvmanager.py:199-373: names,
kinds, and defaults of the same value and type; the wrapper a decorator puts there, not what it wraps) is
recorded through a method with that signature, which passes every argument on by position; any other
signature (another FlexKV, a stand-in) gets the generic pass-through, which forwards exactly what the caller
passed. Both record the same log for every call FlexKV's connector makes. Compared once, when the bridge is
built: a method replaced on the manager afterwards is called as the one compared.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

# The log's entries: (what, value) as FlexKV's KVManager gave it, parsed only when a rule reads them; BARRIER: this
# rank entered FlexKV's TP barrier (every rank, leader or not).
CREATED, LAUNCHED, WAITED, RAISED, BARRIER = "created", "launched", "waited", "raised", "barrier"


def observe_barrier(sync: Any, log: list[tuple[str, Any]]) -> None:
    """FlexKV's comm (``_sync_ctx``) logs each entry into its barrier (comm.py:374-383) in ``log``, unchanged
    otherwise: whether a raising ``retrieve_kv`` got there (connector.py:692-693) decides whether its rank must
    still enter it, or leave the other ranks waiting in it."""
    barrier = sync.barrier

    def logged_barrier(*args: Any, **kwargs: Any) -> Any:
        log.append((BARRIER, None))
        return barrier(*args, **kwargs)

    sync.barrier = logged_barrier


class ObservedManager:
    """The manager, each call appending FlexKV's own answer to :attr:`log` (the bridge clears it as each of its
    calls starts; :class:`.outcomes.Seen` parses it when asked). Its methods are set on the instance: FlexKV
    34ab141's signatures (:func:`_recorders`) where the manager declares the same, else the generic pass-through.
    Plain functions closed over the manager and the log: no method binding, no attribute reads of this object but
    the namespace, on the four or five calls a request makes."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.log: list[tuple[str, Any]] = []
        # the FlexKV namespace of the request being matched or stored (set around SGLang's call: .namespaces), given
        # to get_match/put_match, which FlexKV's connector calls without one (connector.py:496, 1065)
        self.namespace: list[str] | None = None
        exact = _recorders(self, manager, self.log)
        self.generic: tuple[str, ...] = tuple(name for name in _GENERIC if not _same_signature(manager, exact[name]))
        for name in _GENERIC:
            setattr(self, name, types.MethodType(_GENERIC[name], self) if name in self.generic else exact[name])

    def __getattr__(self, name: str) -> Any:
        if name == "manager":
            raise AttributeError(name)
        return getattr(self.manager, name)


def _recorders(observed: ObservedManager, manager: Any, log: list[tuple[str, Any]]) -> dict[str, Any]:
    """The recorder's methods with FlexKV 34ab141's KVManager signatures (kvmanager.py:199-373), every argument
    passed on by position. The manager's method is read on each call: one replaced later is the one called."""
    append = log.append

    def get_match(token_ids: Any, token_mask: Any = None, cpu_only: bool = False, namespace: Any = None,
                  swa_aware: bool = False) -> Any:  # fmt: skip
        result = manager.get_match(token_ids, token_mask, cpu_only, namespace or observed.namespace, swa_aware)
        append((CREATED, result))
        return result

    def put_match(token_ids: Any, token_mask: Any = None, namespace: Any = None) -> Any:
        result = manager.put_match(token_ids, token_mask, namespace or observed.namespace)
        append((CREATED, result))
        return result

    def launch(task_ids: Any, slot_mappings: Any, swa_slot_mappings: Any = None, as_batch: bool = False,
               layerwise_transfer: bool = False, counter_id: int = 0) -> Any:  # fmt: skip
        try:
            result = manager.launch(task_ids, slot_mappings, swa_slot_mappings, as_batch, layerwise_transfer,
                                    counter_id)  # fmt: skip
        except BaseException as exc:
            append((RAISED, exc))
            raise
        append((LAUNCHED, task_ids))
        return result

    def wait(task_ids: Any, timeout: float = 20.0, completely: bool = False) -> Any:
        try:
            result = manager.wait(task_ids, timeout, completely)
        except BaseException as exc:
            append((RAISED, exc))
            raise
        append((WAITED, result))
        return result

    def try_wait(task_ids: Any) -> Any:
        """FlexKV's store poll, every step: set on the instance, as a miss into __getattr__ costs an AttributeError."""
        return manager.try_wait(task_ids)

    return {"get_match": get_match, "put_match": put_match, "launch": launch, "wait": wait, "try_wait": try_wait}


def _parameters(fn: Any) -> list[inspect.Parameter] | None:
    """The parameters ``fn`` itself declares (not those of what a decorator wraps: the wrapper is what runs)."""
    try:
        return list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return None


def _same_default(a: Any, b: Any) -> bool:
    """The same value of the same type (20 and 20.0, False and 0 differ); a comparison that fails is a difference."""
    try:
        return a is b or (type(a) is type(b) and bool(a == b))
    except Exception:
        return False


def _same_signature(manager: Any, recorder: Any) -> bool:
    """Whether ``manager``'s method of the recorder's name takes what the recorder does, with the same defaults: only
    then may it pass every argument on by position (a default of its own would replace the manager's). Compared once,
    when the bridge is built: a method replaced on the manager later is called as the one compared."""
    ours, theirs = _parameters(recorder), _parameters(getattr(manager, recorder.__name__, None))
    if ours is None or theirs is None or len(theirs) != len(ours):
        return False
    return all(t.name == o.name and t.kind == o.kind and _same_default(t.default, o.default)
               for t, o in zip(theirs, ours, strict=True))  # fmt: skip


def _generic(self: ObservedManager, name: str, what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The manager's ``name`` called with exactly what the caller passed, recorded as the methods above record."""
    try:
        result = getattr(self.manager, name)(*args, **kwargs)
    except BaseException as exc:
        if what != CREATED:  # launch and wait: the error a rule reads
            self.log.append((RAISED, exc))
        raise
    if what == LAUNCHED:
        self.log.append((what, kwargs["task_ids"] if "task_ids" in kwargs else args[0] if args else ()))
    else:
        self.log.append((what, result))
    return result


def _spaced(self: ObservedManager, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The caller's keywords, with the request's namespace where one is set (a manager without the keyword raises:
    the call fails as a miss, never runs without it)."""
    return kwargs if self.namespace is None else {**kwargs, "namespace": self.namespace}


_GENERIC = {
    "get_match": lambda self, *args, **kwargs: _generic(self, "get_match", CREATED, args, _spaced(self, kwargs)),
    "put_match": lambda self, *args, **kwargs: _generic(self, "put_match", CREATED, args, _spaced(self, kwargs)),
    "launch": lambda self, *args, **kwargs: _generic(self, "launch", LAUNCHED, args, kwargs),
    "wait": lambda self, *args, **kwargs: _generic(self, "wait", WAITED, args, kwargs),
    "try_wait": lambda self, *args, **kwargs: self.manager.try_wait(*args, **kwargs),
}

__all__ = ["BARRIER", "CREATED", "LAUNCHED", "RAISED", "WAITED", "ObservedManager", "observe_barrier"]
