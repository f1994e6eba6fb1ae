"""A FlexKV task whose launch raised is cancelled as the task never launched that it is, so its plan is rolled back.

FlexKV 34ab141's ``launch_tasks`` marks each task RUNNING (``check_task_ready``, kvtask.py:815-830) before it
submits the graphs to its transfer process (kvtask.py:1430-1432; transfer_manager.py:1202-1212, a pipe send
that raises ``BrokenPipeError`` once that process is gone). The graph never reaches a transfer, yet
``cancel`` rolls back only a task that is UNREADY or READY (``_cancel_task``, kvtask.py:735-756): for a
RUNNING one it keeps the plan, which FlexKV's own comment there calls a leak (:740-748). A put's unready
index nodes then shadow the prefix for good (``put_match`` counts them as present, so every later store of
the prefix starts nothing, and ``get_match`` never serves them); a get's matched nodes stay locked against
eviction.

:func:`cancel_unlaunched` puts such a task back to READY, the state ``check_task_ready`` took it from, then
cancels it through FlexKV, whose abort (``_abort_task_plans``, kvtask.py:701-711) rolls the plan back. Only
where that is certain: FlexKV's task engine runs in this process (``KVManager.kv_task_engine``; in its
server-client mode the table is in FlexKV's server, out of reach, and FlexKV's own cancel decides), and it
has one transfer handle (with several, nnodes > 1, an earlier handle may have taken the graph, whose copy
then runs and must keep its plan). With ``flexkv_adapter/flexkv/reset.py`` the plugin's only change to
FlexKV's state (listed in docs/sglang.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)


def cancel_unlaunched(manager: Any, task_ids: Sequence[int]) -> list[int]:
    """Cancel ``task_ids``, tasks whose launch did not return, through FlexKV's ``cancel``; each one FlexKV marked
    RUNNING before its launch raised is first put back to READY. The ids put back."""
    engine = getattr(manager, "kv_task_engine", None)
    tasks = getattr(engine, "tasks", None)
    rolled: list[int] = []
    if tasks is not None and len(getattr(engine, "transfer_handles", None) or ()) == 1:
        for tid in task_ids:
            task = tasks.get(tid)
            status: Any = getattr(task, "status", None)
            if getattr(status, "name", None) == "RUNNING":  # FlexKV's TaskStatus (kvtask.py:40-52)
                task.status = type(status).READY
                rolled.append(tid)
    if rolled:
        logger.info(
            "flexkv_adapter (SGLang plugin): FlexKV task(s) %s were marked running but their launch raised before any "
            "transfer took them; put back to ready, so that FlexKV's cancel rolls their plan back (kvtask.py:740-748)",
            rolled,
        )
    manager.cancel(list(task_ids))
    return rolled


__all__ = ["cancel_unlaunched"]
