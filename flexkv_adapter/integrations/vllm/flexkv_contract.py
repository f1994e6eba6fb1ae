"""What the wrappers (:mod:`.lifecycle`) call on FlexKV's vLLM connector, as FlexKV 34ab141 declares it.

Checked when vLLM's ``FlexKVConnectorV1`` is constructed, after FlexKV's own constructor ran: a FlexKV whose
methods or task tables differ is refused there with their names, never run half-wrapped (a failed load would be
served as a cache hit).
"""

from __future__ import annotations

import inspect
from typing import Any

from ...errors import AdapterError

# FlexKV 34ab141: (owner, method) -> parameters the wrappers call with
FLEXKV_METHODS: dict[tuple[str, str], tuple[str, ...]] = {
    ("impl", "build_connector_meta"): ("self", "scheduler_output"),
    ("impl", "reset_cache"): ("self",),
    ("impl", "before_device_sleep"): ("self",),
    ("impl", "after_device_wake"): ("self",),
    ("impl", "get_num_new_matched_tokens"): ("self", "request", "num_computed_tokens"),
    ("impl", "request_finished"): ("self", "request", "block_ids"),
    ("scheduler", "query_finished_task"): ("self",),
    ("scheduler", "get_and_clear_failed_block_ids"): ("self",),
    ("scheduler", "wait_for_all_get_tasks"): ("self",),
    ("scheduler", "launch_tasks"): ("self",),
    ("scheduler", "_extract_namespace"): ("self", "request"),
}
# FlexKV's methods the plugin replaces on its scheduler connector instance (lifecycle.attach), with FlexKV's lines
FLEXKV_REPLACED: dict[str, str] = {
    "FlexKVSchedulerConnector._extract_namespace": "adp:344-390 (untagged [lora_name, cache_salt], joined with NUL "
    "by block.py:11-20), read at adp:421 (get) and adp:580 (put): lifecycle.namespace",
}
FLEXKV_STATE = ("get_tasks", "put_tasks", "req_id_to_task_dict", "tasks_to_launch")


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def check_flexkv(impl: Any) -> None:
    """Refuse a FlexKV whose connector differs from 34ab141 in what the wrappers call."""
    owners = {"impl": type(impl), "scheduler": type(getattr(impl, "connector", None))}
    is_scheduler = getattr(getattr(impl, "role", None), "name", "") == "SCHEDULER"
    problems = []
    for (owner, name), params in FLEXKV_METHODS.items():
        if owner == "scheduler" and not is_scheduler:
            continue
        fn = getattr(owners[owner], name, None)
        if fn is None or _params(fn) != params:
            problems.append(f"{owners[owner].__name__}.{name}")
    if is_scheduler:
        problems += [
            f"FlexKVSchedulerConnector.{n}"
            for n in FLEXKV_STATE
            if not isinstance(getattr(impl.connector, n, None), dict)
        ]
    if problems:
        raise AdapterError(
            f"flexkv_adapter: FlexKV's vLLM connector differs from the one the plugin was proven on (34ab141) in "
            f"{', '.join(problems)}; without these wrappers a failed FlexKV load is served as a cache hit, so the "
            f"plugin refuses. Use FlexKV 34ab141 or a flexkv-adapter release that supports this FlexKV"
        )


__all__ = ["FLEXKV_METHODS", "FLEXKV_REPLACED", "FLEXKV_STATE", "check_flexkv"]
