"""flexkv.reset: FlexKV's task table as FlexKV means it before its reset reads every value (kvtask.py:1461)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from flexkv_adapter.flexkv.reset import CONSTRUCTOR_KEYWORDS, repair_task_table


class Task:
    """A KVTask as reset_cache reads it."""

    def is_completed(self) -> bool:
        return True


def flexkv_reset_cache(tasks: dict) -> int:
    """FlexKV 34ab141's pass over its task table in reset_cache (kvtask.py:1461)."""
    return sum(1 for t in list(tasks.values()) if not t.is_completed())


def manager(tasks: object) -> SimpleNamespace:
    return SimpleNamespace(kv_task_engine=SimpleNamespace(tasks=tasks))


ENTRIES = st.dictionaries(
    st.one_of(st.integers(0, 2**40), st.sampled_from([*CONSTRUCTOR_KEYWORDS, "other"])),
    st.one_of(st.builds(Task), st.integers(0, 10**6), st.text(max_size=3)),
    max_size=12,
)


@given(ENTRIES)
def test_only_the_keywords_ints_leave_the_table(entries):
    tasks = dict(entries)
    removed = repair_task_table(manager(tasks))
    gone = {k for k in CONSTRUCTOR_KEYWORDS if type(entries.get(k)) is int}
    assert set(removed) == gone and len(removed) == len(gone)
    assert tasks == {k: v for k, v in entries.items() if k not in gone}


@given(st.dictionaries(st.integers(0, 2**40), st.builds(Task), max_size=8))
def test_flexkvs_reset_reads_a_table_built_with_expiring_dict_1_1_2_once_repaired(real_tasks):
    tasks = {"max_age_seconds": 1800, "max_len": 100000, **real_tasks}  # kvtask.py:212 under expiring-dict 1.1.2
    assert repair_task_table(manager(tasks)) == list(CONSTRUCTOR_KEYWORDS)
    assert flexkv_reset_cache(tasks) == 0 and tasks == real_tasks


def test_a_manager_without_an_in_process_task_engine_is_left_alone():
    assert repair_task_table(SimpleNamespace()) == []  # server-client mode: the table is in FlexKV's server
    assert repair_task_table(manager(None)) == []
    assert repair_task_table(None) == []


class Hostile(dict):
    """A table that answers a read and refuses a removal (not FlexKV's: any mapping of another kind)."""

    def __delitem__(self, key):
        raise RuntimeError("read-only table")


def test_a_table_that_refuses_the_repair_is_left_to_flexkvs_reset_with_a_warning(caplog):
    tasks = Hostile(max_age_seconds=1800, max_len=100000)
    assert repair_task_table(manager(tasks)) == [] and len(tasks) == 2
    assert "could not be repaired (RuntimeError: read-only table)" in caplog.text
