"""What FlexKV's scheduler side has finished, and what vLLM 0.33 has still to be told about it.

FlexKV's connector (``vllm_v1_adapter.py`` at 34ab141) polls its transfers in
``update_connector_output`` and *overwrites* vLLM's ``finished_sending``/``finished_recving``
(adp:1204-1206), reporting a FAILED load as a finished one. vLLM reads a step's failures
(``invalid_block_ids``) before it calls ``update_connector_output`` (scheduler.py:2292-2305 vs
:3566), so a failure found there is a step too late. The ledger keeps the outcome per request:

- loads and saves that succeeded go into this step's output (merged, never overwritten);
- a failed load is held back one step and handed to the workers in the next
  :class:`FlexKVAdapterMetadata`: every worker then reports the request in ``finished_recving``
  *and* its blocks from ``get_block_ids_with_load_errors`` in the same pass, which is what
  ``kv_connector/v1/base.py:92, :438`` asks for; vLLM applies ``kv_load_failure_policy``;
- a request whose load failed is not offered FlexKV's hit again (it would fail and loop).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_Base: Any
try:  # vLLM present (the plugin's only context): metadata must be vLLM's type to travel to workers
    _Base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base").KVConnectorMetadata
except Exception:  # pragma: no cover - vLLM absent: the plugin is never installed
    _Base = object


@dataclass(frozen=True)
class FlexKVAdapterMetadata(_Base):  # type: ignore[misc]
    """Scheduler -> workers: loads to report finished this step, and the blocks that failed to load."""

    recving: frozenset[str] = frozenset()
    load_errors: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Poll:
    """One poll of FlexKV, classified: finished saves, good loads, failed loads (request -> blocks)."""

    sending: frozenset[str]
    recving: frozenset[str]
    failed: dict[str, frozenset[int]]


def snapshot(tasks: dict[int, list[Any]], only: Iterable[int] | None = None) -> dict[str, tuple[Any, frozenset[int]]]:
    """request id -> (vLLM request, GPU block ids) of FlexKV's launched get tasks (``get_tasks``, adp:262);
    ``only``: of these task ids (a poll reads just the ones FlexKV popped: a step holds hundreds in flight)."""
    ids = tasks.keys() if only is None else only
    return {t.request.request_id: (t.request, frozenset(t.block_ids)) for tid in ids for t in tasks[tid]}


def classify(
    sending: Iterable[str],
    recving: Iterable[str],
    failed_blocks: set[int],
    before: dict[str, tuple[Any, frozenset[int]]],
) -> Poll:
    """Split FlexKV's finished loads into good and failed ones by the failed block ids it collected.

    A finished request vLLM already ended (aborted while loading) is passed through as finished:
    vLLM frees its blocks without caching them, so there is nothing to invalidate.
    """
    good: set[str] = set()
    failed: dict[str, frozenset[int]] = {}
    for req_id in recving:
        request, blocks = before.get(req_id, (None, frozenset()))
        finished = request is not None and bool(request.is_finished())
        if blocks & failed_blocks and not finished:
            failed[req_id] = blocks
        else:
            good.add(req_id)
    return Poll(frozenset(sending), frozenset(good), failed)


_EMPTY = FlexKVAdapterMetadata()  # the metadata of a step with no failed load to hand over


@dataclass
class Ledger:
    """Per scheduler-side connector: outcomes polled from FlexKV and not yet told to vLLM."""

    sending: set[str] = field(default_factory=set)
    recving: set[str] = field(default_factory=set)
    failed: dict[str, frozenset[int]] = field(default_factory=dict)  # held back, for the next metadata
    with_workers: set[str] = field(default_factory=set)  # in a metadata, not yet back in an output
    no_refetch: set[str] = field(default_factory=set)  # load failed: no FlexKV hit again

    def add(self, poll: Poll) -> None:
        self.sending |= poll.sending
        self.recving |= poll.recving
        for req_id, blocks in poll.failed.items():
            logger.warning(
                "flexkv_adapter: FlexKV failed to load %d block(s) of request %s; vLLM is told they are invalid",
                len(blocks),
                req_id,
            )
            self.failed[req_id] = blocks
            self.no_refetch.add(req_id)

    def metadata(self) -> FlexKVAdapterMetadata:
        """Hand the held-back failures to the workers, who report them with their failed blocks."""
        if not self.failed:  # nearly every step: the one empty metadata (frozen), not a new one
            return _EMPTY
        failed, self.failed = self.failed, {}
        self.with_workers |= set(failed)
        errors = frozenset(b for blocks in failed.values() for b in blocks)
        return FlexKVAdapterMetadata(recving=frozenset(failed), load_errors=errors)

    def merge_into(self, output: Any) -> None:
        """Add what FlexKV finished to vLLM's output, keeping what the workers reported."""
        sending = set(output.finished_sending or ())
        recving = set(output.finished_recving or ())
        if self.sending:
            sending |= self.sending
            self.sending.clear()
        if self.recving:
            recving |= self.recving
            self.recving.clear()
        output.finished_sending, output.finished_recving = sending, recving
        if self.with_workers and recving:
            self.with_workers -= recving

    def finished(self, req_id: str) -> bool:
        """vLLM ended the request: True if its blocks must wait for a finished_recving report of it.

        vLLM frees an ended request that waited for a load only once it is reported finished
        (scheduler.py:3017-3021), so a held-back failure is still reported, as a plain finish.
        """
        self.no_refetch.discard(req_id)
        if self.failed.pop(req_id, None) is not None:
            self.recving.add(req_id)
            return True
        return req_id in self.with_workers

    @property
    def pending(self) -> bool:
        return bool(self.sending or self.recving or self.failed or self.with_workers)
