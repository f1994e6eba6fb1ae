"""The vLLM plugin's poll of FlexKV: each finished load or save lands in the ledger once, a failed load with
its own blocks, and nothing is read of a transfer still in flight.

The scheduler side below follows FlexKV 34ab141's ``query_finished_task`` (vllm_v1_adapter.py:692-733): it
pops every task FlexKV reports ended, and a failed get task's block ids go to ``failed_block_ids``.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.integrations.vllm.ledger import Ledger
from flexkv_adapter.integrations.vllm.lifecycle import _poll


class _Task:
    """A get or put task of one request; reading the blocks of a task still in flight is a test failure."""

    def __init__(self, req_id: str, blocks: list[int], in_flight: bool, finished: bool) -> None:
        self.request = SimpleNamespace(request_id=req_id, is_finished=lambda: finished)
        self._blocks, self.in_flight = blocks, in_flight

    @property
    def block_ids(self) -> list[int]:
        assert not self.in_flight, f"read the blocks of {self.request.request_id}, still in flight"
        return self._blocks


class _SchedulerSide:
    def __init__(self, get_tasks: dict, put_tasks: dict, ended: dict[int, bool]) -> None:
        self.get_tasks, self.put_tasks, self.ended = get_tasks, put_tasks, ended
        self.failed_block_ids: set[int] = set()

    def query_finished_task(self) -> tuple[set[str], set[str]]:
        sending, recving = set(), set()
        for tid, ok in self.ended.items():
            if tid in self.get_tasks:
                tasks = self.get_tasks.pop(tid)
                recving.update(t.request.request_id for t in tasks)
                if not ok:
                    for t in tasks:
                        self.failed_block_ids.update(t.block_ids)
            else:
                tasks = self.put_tasks.pop(tid)
                sending.update(t.request.request_id for t in tasks)
        return sending, recving

    def get_and_clear_failed_block_ids(self) -> set[int]:
        failed, self.failed_block_ids = self.failed_block_ids, set()
        return failed


# per task: a get (or a put), whether FlexKV reports it ended this poll, whether it succeeded, and whether vLLM
# already ended its request (aborted while loading)
_TASK = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans())


@given(st.lists(_TASK, min_size=1, max_size=8))
def test_a_poll_records_each_ended_transfer_once_and_reads_nothing_of_those_in_flight(tasks):
    get_tasks: dict[int, list[_Task]] = {}
    put_tasks: dict[int, list[_Task]] = {}
    ended: dict[int, bool] = {}
    expected_good, expected_failed, expected_sent = set(), {}, set()
    for tid, (is_get, ends, ok, aborted) in enumerate(tasks):
        req, blocks = f"r{tid}", [10 * tid + k for k in range(3)]  # each task its own blocks
        task = _Task(req, blocks, in_flight=not ends, finished=aborted)
        (get_tasks if is_get else put_tasks)[tid] = [task]
        if ends:
            ended[tid] = ok
            if not is_get:
                expected_sent.add(req)
            elif ok or aborted:  # an aborted request's failed load is a plain finish: vLLM frees its blocks
                expected_good.add(req)
            else:
                expected_failed[req] = frozenset(blocks)
    side = _SchedulerSide(get_tasks, put_tasks, ended)
    ledger = Ledger()
    _poll(SimpleNamespace(_flexkv_connector=SimpleNamespace(connector=side)), ledger)
    assert ledger.recving == expected_good and ledger.failed == expected_failed and ledger.sending == expected_sent
    assert ledger.no_refetch == set(expected_failed)
    assert set(side.get_tasks) | set(side.put_tasks) == {tid for tid in range(len(tasks)) if tid not in ended}
