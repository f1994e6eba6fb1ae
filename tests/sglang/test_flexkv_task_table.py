"""flexkv.reset over FlexKV's task table as FlexKV 34ab141 builds it, with the expiring-dict it pins (1.1.2):
the table's two keyword entries leave, the tasks beside them stay, and FlexKV's reset pass then reads it.

One table only: each ExpiringDict starts a thread of its own that lives as long as the process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flexkv_adapter.flexkv.reset import CONSTRUCTOR_KEYWORDS, repair_task_table

expiring_dict = pytest.importorskip("expiring_dict")  # FlexKV's requirement, installed with the SGLang tier


class Task:
    def __init__(self, done: bool) -> None:
        self.done = done

    def is_completed(self) -> bool:
        return self.done


def test_the_keywords_leave_the_pinned_expiring_dict_and_every_task_stays():
    tasks = expiring_dict.ExpiringDict(max_age_seconds=1800, max_len=100000)  # kvtask.py:212, verbatim
    assert dict(tasks.items()) == {"max_age_seconds": 1800, "max_len": 100000}  # what 1.1.2 makes of them
    done_by_id = {0: True, 7: False, 2**31: True, 3: False}
    for task_id, done in done_by_id.items():
        tasks[task_id] = Task(done)
    manager = SimpleNamespace(kv_task_engine=SimpleNamespace(tasks=tasks))
    assert repair_task_table(manager) == list(CONSTRUCTOR_KEYWORDS)
    assert sorted(tasks) == sorted(done_by_id)
    assert sum(1 for t in list(tasks.values()) if not t.is_completed()) == 2  # FlexKV's pass (kvtask.py:1461)
    assert repair_task_table(manager) == []  # a second flush: nothing left to repair
