"""Every FlexKV outcome of an SGLang load becomes "loaded N on every rank" or a miss, in one place.

FlexKV's connector (34ab141) answers ``retrieve_kv`` with a slot count that hides what happened:
non-leader ranks return the full count whatever the leader's copy did (connector.py:634, :694), a
copy past ``wait``'s 30 s deadline returns 0 while FlexKV still writes the slots (:666;
kvtask.py:1097-1104), and a launch error is re-raised on the leader before the barrier its peers wait
in (:644-655). :class:`.recorder.ObservedManager` records what the leader's ``KVManager`` did
during a call; :func:`load_outcome` classifies it; :class:`Agreement` makes every TP rank take the same
answer; :class:`Quarantine` keeps slots FlexKV may still write until FlexKV reports the task ended.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import AdapterError
from .recorder import CREATED, LAUNCHED, RAISED, WAITED, ObservedManager

logger = logging.getLogger(__name__)

# A task in one of these states no longer touches GPU memory (FlexKV's own terminal set, connector.py:84).
ENDED = frozenset({"success", "failed", "cancelled", "not_found"})
QUARANTINE = -1  # the agreed answer "FlexKV may still write these slots"


def status_of(response: Any) -> str:
    """FlexKV's ``KVResponse`` status as its connector spells it (``_status_value``)."""
    status = getattr(response, "status", None)
    value = getattr(status, "value", status)
    return str(value).lower() if value is not None else "missing"


class Seen:
    """What FlexKV's KVManager did during one bridge call (leader only), parsed from the recorder's log where a
    failure's rule reads it (the success paths read only :func:`waited`)."""

    __slots__ = ("created", "launched", "manager_error")

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.created: list[int] = []  # get_match / put_match task ids
        self.launched: list[int] = []  # launch() returned for these
        self.manager_error: BaseException | None = None  # the last error launch() or wait() raised
        for what, value in log:
            if what == LAUNCHED:
                self.launched += _ids(value)
            elif what == CREATED:
                if isinstance(value, tuple) and value and isinstance(value[0], int) and value[0] >= 0:
                    self.created.append(value[0])
            elif what == RAISED:
                self.manager_error = value


def _ids(value: Any) -> list[int]:
    """launch()'s task ids as FlexKV takes them: a list, or one id (kvmanager.py:307-315); ids this cannot read
    (no FlexKV passes them) are none, logged, rather than an error raised where a rule reads the record."""
    if type(value) is list:
        return value
    try:
        return [int(value)] if hasattr(value, "__index__") else [int(v) for v in value]
    except (TypeError, ValueError) as exc:
        logger.warning("flexkv_adapter (SGLang plugin): launch() took task ids it cannot read (%r: %s)", value, exc)
        return []


def waited(log: list[tuple[str, Any]], tid: int, unseen: str = "") -> str:
    """Task ``tid``'s status as the last wait that answered for it gave it (:func:`status_of`), or ``unseen``."""
    for what, value in reversed(log):
        if what == WAITED and value and tid in value:
            return status_of(value[tid])
    return unseen


class Agreement:
    """MIN over the attention TP ranks (gloo CPU group), only where FlexKV's connector itself syncs."""

    def __init__(self, attn_tp_group: Any, needs_sync: bool) -> None:
        self.group = getattr(attn_tp_group, "cpu_group", attn_tp_group)
        self.active = bool(needs_sync) and self.group is not None

    def min(self, values: list[int]) -> list[int]:
        if not self.active or not values:
            return values  # the callers' own fresh lists: nothing to copy
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group)
        return [int(v) for v in tensor.tolist()]


def load_outcome(leader: bool, log: list[tuple[str, Any]], tid: int, count: int, returned: int | None,
                 raised: bool) -> int:  # fmt: skip
    """This rank's answer for one load (``log``: the recorder's, of this call): ``count`` (every slot written),
    0 (a miss, nothing writes the slots) or :data:`QUARANTINE` (FlexKV launched a copy whose end it has not
    reported)."""
    if not leader:
        return count if not raised and returned == count else 0
    status = waited(log, tid)
    if not raised and status == "success" and returned == count:
        return count
    if status not in ENDED and tid in Seen(log).launched:
        return QUARANTINE  # past the deadline (timeout), or wait() raised: the copy may still run
    return 0


@dataclass
class _Held:
    tid: int  # the leader's FlexKV task (-1 on other ranks)
    slots: torch.Tensor  # on SGLang's device and in its dtype: its allocator's free lists live there


_NO_OWN_FREE = object()  # the allocator's free was its class's (no instance attribute to restore)


class Quarantine:
    """Slots of loads FlexKV may still write: SGLang's free of them is withheld until FlexKV reports the end.

    The entries are the same, in the same order, on every TP rank (they come from agreed outcomes), and a
    release is agreed too: the leader's FlexKV task decides for all ranks (it writes every rank's slots).
    """

    def __init__(self, agreement: Agreement) -> None:
        self.agreement = agreement
        self.held: list[_Held] = []
        self.allocator: Any = None
        self._withheld: set[int] = set()
        self._unreachable = False
        self._depth = 0  # inside withholding()
        # while the filter is on: the allocator it is on, and that allocator's own instance attribute ``free``
        # (_NO_OWN_FREE if its free is its class's), both recorded when it went on and restored exactly
        self._filtered: tuple[Any, Any] | None = None

    def __len__(self) -> int:
        return len(self.held)

    def add(self, tid: int, slots: torch.Tensor) -> None:
        # a copy (SGLang may reuse the tensor), not moved: free() later concatenates it with GPU free lists
        self.held.append(_Held(tid, slots.detach().clone()))
        self._withheld.update(int(s) for s in slots.detach().to("cpu", torch.int64).tolist())
        if self._depth:  # SGLang's init_load_back frees these next
            self._filter_on()

    def withholding(self, allocator: Any) -> Quarantine:
        """While SGLang's init_load_back runs (``with quarantine.withholding(allocator):``): its ``free`` of
        quarantined slots keeps them here. The filter is on ``allocator.free`` only while something is withheld
        (a load that this call quarantines puts it on at once): a plain context manager, as it runs on every
        load (a generator-based one and a filter on every call cost more than the rest of the hook)."""
        if allocator is not self.allocator:  # the one attached at start-up passed attach's checks then
            self.attach(allocator)  # before __enter__: a refusal leaves the depth and any filter as they were
        return self

    def attach(self, allocator: Any) -> None:
        """The allocator whose ``free`` is filtered (the bridge attaches SGLang's at start-up, where a refusal
        stops the server instead of a load)."""
        if self._depth and allocator is not self.allocator:
            raise AdapterError("the quarantine withholds from one allocator at a time: a second one inside")
        if not hasattr(allocator, "__dict__"):
            raise AdapterError(
                f"the quarantine cannot withhold slots from {type(allocator).__name__}: its free() is not "
                "replaceable on the instance (no __dict__)"
            )
        self.allocator = allocator

    def __enter__(self) -> None:
        if self._withheld:
            self._filter_on()
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if not self._depth and self._filtered is not None:
            allocator, own = self._filtered
            if own is _NO_OWN_FREE:
                del allocator.free
            else:
                allocator.free = own
            self._filtered = None

    def _filter_on(self) -> None:
        """The filter on the current allocator's free; it calls the free it replaced, whatever happens later."""
        if self._filtered is None:
            allocator = self.allocator
            real_free = allocator.free
            withheld = self._withheld

            def free(free_index: Any) -> Any:
                """The allocator's free, less the slots FlexKV may still write."""
                if withheld and isinstance(free_index, torch.Tensor) and free_index.numel():
                    held = torch.tensor(sorted(withheld), dtype=free_index.dtype, device=free_index.device)
                    free_index = free_index[~torch.isin(free_index, held)]
                    if not free_index.numel():
                        return None
                return real_free(free_index)

            self._filtered = (allocator, vars(allocator).get("free", _NO_OWN_FREE))
            allocator.free = free

    def poll(self, manager: Any, leader: bool) -> int:
        """Give back the slots of every task FlexKV reports ended (a collective when anything is held)."""
        if not self.held:
            return 0
        flags = [1] * len(self.held)
        if leader and manager is not None:
            tids = [h.tid for h in self.held]
            # the answer is read inside the try too: the leader must reach the collective whatever FlexKV returns
            try:
                responses = manager.try_wait(tids) or {}
                flags = [int(status_of(responses.get(t)) in ENDED) for t in tids]
            except Exception as exc:  # FlexKV unreachable or unreadable: keep the slots, and say so once
                if not self._unreachable:
                    logger.warning("flexkv_adapter (SGLang plugin): FlexKV's try_wait failed (%s); %d quarantined "
                                   "load(s) keep their slots until it answers", exc, len(tids))  # fmt: skip
                self._unreachable, flags = True, [0] * len(tids)
            else:
                self._unreachable = False
        flags = self.agreement.min(flags)
        ended = [h for h, f in zip(self.held, flags, strict=True) if f]
        self.held = [h for h, f in zip(self.held, flags, strict=True) if not f]
        for h in ended:
            self._withheld.difference_update(int(s) for s in h.slots.to("cpu", torch.int64).tolist())
            if self.allocator is not None:
                self.allocator.free(h.slots)
        if ended:
            logger.info("flexkv_adapter (SGLang plugin): %d quarantined load(s) ended; their slots are free again",
                        len(ended))  # fmt: skip
        return len(ended)


__all__ = [
    "ENDED",
    "QUARANTINE",
    "Agreement",
    "ObservedManager",
    "Quarantine",
    "Seen",
    "load_outcome",
    "status_of",
    "waited",
]
