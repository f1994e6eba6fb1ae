"""FlexKV's ``KVManager.reset`` as FlexKV means it, for every engine's flush (SGLang) and reset (vLLM).

FlexKV 34ab141 pins ``expiring-dict==1.1.2`` (requirements.txt:11) and builds its task table as
``ExpiringDict(max_age_seconds=1800, max_len=100000)`` (kvtask.py:212). 1.1.2's constructor is
``(ttl=None, interval=0.1, *args, **kwargs)``: the two keywords become two entries of the table, holding
ints. ``reset_cache`` (kvtask.py:1461, :1478) is the one reader of every value, and calls
``is_completed()`` on each: with FlexKV as shipped every reset raised ``'int' object has no attribute
'is_completed'``, so every flush after a weight update failed. FlexKV keys its tasks by int task ids
(kvtask.py:316-385), so a str key is never a task: :func:`repair_task_table` removes those two entries
(where they hold ints) before FlexKV's reset reads the table. The one patch of FlexKV's state; listed in
docs/flexkv-upstream.md.

Reachable only where FlexKV's task engine runs in this process (``KVManager.kv_task_engine``); in FlexKV's
server-client mode (dp > 1, ``FLEXKV_SERVER_CLIENT_MODE=1`` or more than one instance, kvmanager.py:69-71)
the table lives in FlexKV's server process and the reset fails there as shipped (the engines' failure paths
report it: SGLang's flush answers False, vLLM's reset False).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

CONSTRUCTOR_KEYWORDS = ("max_age_seconds", "max_len")  # kvtask.py:212, as expiring-dict 1.1.2 stores them


def repair_task_table(manager: Any) -> list[str]:
    """Remove the constructor keywords expiring-dict 1.1.2 stored as task entries (logged); the keys removed.
    Each engine calls it just before FlexKV's own reset (SGLang: ``KVManager.reset``; vLLM: the connector's
    ``reset_cache``, which calls it and clears its own tables)."""
    table: Any = getattr(getattr(manager, "kv_task_engine", None), "tasks", None)
    removed = []
    for key in CONSTRUCTOR_KEYWORDS:
        try:
            if type(table[key]) is not int:  # a task is a KVTask; only the keyword's own value is removed
                continue
            del table[key]
        except (KeyError, TypeError):  # absent, or no table here (server-client mode, a stand-in)
            continue
        except Exception as exc:  # a table of another kind: FlexKV's own reset decides, unrepaired
            logger.warning("flexkv_adapter: FlexKV's task table could not be repaired (%s: %s)",
                           type(exc).__name__, exc)  # fmt: skip
            break
        removed.append(key)
    if removed:
        logger.info(
            "flexkv_adapter: removed %s from FlexKV's task table before its reset (expiring-dict 1.1.2 stores "
            "ExpiringDict's keywords as entries, kvtask.py:212; FlexKV's reset_cache fails on them)",
            ", ".join(removed),
        )
    return removed


__all__ = ["CONSTRUCTOR_KEYWORDS", "repair_task_table"]
