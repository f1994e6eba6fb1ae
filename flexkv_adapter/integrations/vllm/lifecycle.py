"""vLLM 0.32-0.34 x FlexKV 34ab141 through the request lifecycle: the wrappers, listed in :data:`PATCHES`.

Each entry names the method of vLLM's ``FlexKVConnectorV1`` it replaces (``Scheduler.``: of vLLM's Scheduler,
:mod:`.scheduler_reset`), the vLLM lines it answers (0.33's line numbers, 0.34's where marked) and the FlexKV lines
it relies on (``vllm_v1_adapter.py`` = adp). Each wrapper is checked against what the running vLLM declares: the
names in :data:`WHERE_DECLARED` (0.33's sleep/wake hooks, 0.34's ``kv_cache_access``) are wrapped only where vLLM's
``KVConnectorBase_V1`` has them. The wrappers call only FlexKV methods and attributes that :func:`check_flexkv` has
verified; a FlexKV or vLLM that differs (or a vLLM outside :data:`~.versions.PROVEN`) is refused at construction
with the reason, instead of being run half-patched.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import time
from typing import Any

from ...config.settings import load_settings
from ...flexkv.namespace import alignment_problem
from ...flexkv.reset import repair_task_table
from . import kv_memory
from .flexkv_contract import check_flexkv
from .ledger import FlexKVAdapterMetadata, Ledger, Poll, classify, snapshot
from .namespaces import UNCARRIED, bypassed, excluded, extras, namespace
from .versions import PROVEN, PROVEN_TEXT, version_problem

logger = logging.getLogger(__name__)

# Only where vLLM's KVConnectorBase_V1 declares them (0.33: base.py:209, 302, 307; not in 0.32)
SLEEP_HOOKS = ("unregister_kv_caches", "restore_kv_caches")
WHERE_DECLARED = (*SLEEP_HOOKS, kv_memory.NAME)  # kv_cache_access: 0.34's base.py:205-213 only
LEDGER = "_flexkv_adapter_ledger"
ASLEEP = "_flexkv_adapter_asleep"
RESET_WAIT = "_flexkv_adapter_reset_wait_s"

# name -> (parameters vLLM 0.33 declares, vLLM lines answered, FlexKV lines relied on)
PATCHES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "get_num_new_matched_tokens": (
        ("self", "request", "num_computed_tokens"),
        "sched:1139; request.py:135,188 (prompt_embeds, mm_features)",
        "adp:344-390 keys on token ids + a namespace, which carries no multimodal input nor prompt embeds "
        "(:mod:`.namespaces`; LoRA and cache_salt go in the namespace); a request whose load failed would be "
        "offered the same hit again",
    ),
    "build_connector_meta": (
        ("self", "scheduler_output"),
        "sched:1789; base.py:92,438 (failures with finished_recving in one pass); sched:3197-3207 preempts "
        "running requests outside schedule(), so one output can preempt and re-admit a request",
        "adp:1159-1202 returns an empty KVConnectorMetadata; FLEXKV_SYNC_GET waits at adp:1199-1200 and "
        "adp:756-781 drops the tasks unreported; adp:1172-1190 + adp:735-754 cancel a re-admitted request's load",
    ),
    "update_connector_output": (
        ("self", "connector_output"),
        "sched:2292-2305 reads failures before sched:3566 calls this",
        "adp:1204-1218 overwrites finished_*; adp:692-728 query_finished_task; adp:730 failed block ids",
    ),
    "request_finished": (
        ("self", "request", "block_ids"),
        "sched:3395; sched:3017-3021 frees a waiting request only once it is reported",
        "adp:505-558, adp:1221",
    ),
    "reset_cache": (
        ("self",),
        "sched:3242; engine/core.py:932-944 (sleep, pause); sched:3395 keeps a storing request's blocks",
        "adp:288-313 drops get/put tasks and unlaunched stores (adp:541-556), adp:644 launch_tasks, adp:1025",
    ),
    "Scheduler.reset_prefix_cache": (  # vLLM's Scheduler, not the connector: scheduler_reset.py
        ("self", "reset_running_requests", "reset_connector"),
        "sched:3212-3219 resets vLLM first and raises on held blocks, sched:3221-3222 the connector after; "
        "sched:3579-3582 frees a stored request's blocks only on an output's finished_sending; 0.34: "
        "engine/core.py:981-995, 1050-1059, 1174-1192 (sleep, release, pause keep the connector on request)",
        "adp:505-558 keeps a stored request's blocks until a poll reports its store (adp:692-728)",
    ),
    "unregister_kv_caches": (("self",), "base.py:302; gpu_worker.py:319,371", "adp:964, adp:1119"),
    "restore_kv_caches": (("self",), "base.py:307; gpu_worker.py:344", "adp:967, adp:1123"),
    "get_finished": (("self", "finished_req_ids"), "kv_connector_model_runner_mixin.py:94", "adp:1093 (None, None)"),
    "get_block_ids_with_load_errors": (("self",), "kv_connector_model_runner_mixin.py:100", "adp:1280 (set())"),
    kv_memory.NAME: (  # a classmethod: vLLM asks the class, so its bound signature is checked (kv_memory.py)
        ("kv_transfer_config",),
        "0.34: base.py:205-213 (IN_PROCESS); config/vllm.py:3180-3266 turns the extensible KV cache on",
        "flexkv/common/memory_handle.py:688-692 cannot export driver-mapped memory without a shareable handle",
    ),
    # wrapped by vllm_stats.wrap (installed by vllm.install), not by wrappers()
    "get_kv_connector_stats": (("self",), "base.py:453-454 (last interval); metrics.py:65-91 sums", "adp:1247-1278"),
}
CLASS_METHODS = (kv_memory.NAME,)  # installed with classmethod(): vLLM asks the class, before any construction
# Base-class methods the workers' report travels through (kv_connector.py:83-150 -> base.py:249-290, 416-424):
# vLLM's FlexKVConnectorV1 must not override them, or the wrapped get_finished is never asked.
BASE_PATH = ("get_transfer_results", "bind_connector_metadata", "_get_connector_metadata", "has_connector_metadata")


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _base(cls: Any) -> Any:
    return next((c for c in cls.__mro__ if c.__name__ == "KVConnectorBase_V1"), None)


def applicable(cls: Any) -> tuple[str, ...]:
    """The connector's :data:`PATCHES` names this vLLM declares: all, less those of :data:`WHERE_DECLARED` that the
    base class lacks."""
    base = _base(cls)
    own = (n for n in PATCHES if not n.startswith("Scheduler."))
    return tuple(n for n in own if n not in WHERE_DECLARED or (base is not None and hasattr(base, n)))


def vllm_mismatch(cls: Any, version: str | None = None) -> str | None:
    """Why vLLM's ``FlexKVConnectorV1`` is not a class the wrappers were proven on, or None."""
    if version is None:
        version = str(getattr(importlib.import_module("vllm"), "__version__", ""))
    problem = version_problem(version)
    if problem:
        return problem
    for name in applicable(cls):
        params = PATCHES[name][0]
        fn = getattr(cls, name, None)
        if fn is None or _params(fn) != params:
            got = _params(fn) if fn is not None else "missing"
            return f"vLLM's FlexKVConnectorV1.{name} is {got}, not {params} (vLLM {version})"
    base = _base(cls)
    for name in BASE_PATH:
        if base is None or cls.__dict__.get(name, base.__dict__.get(name)) is not base.__dict__.get(name):
            return (
                f"vLLM's FlexKVConnectorV1 overrides {name}, which carries failed-load reports to vLLM (vLLM {version})"
            )
    return None


def attach(conn: Any) -> None:
    """After construction: verify FlexKV, give the scheduler side its ledger and a reporting sync wait."""
    impl = conn._flexkv_connector
    check_flexkv(impl)
    if impl.role.name != "SCHEDULER":
        return
    ledger = Ledger()
    setattr(conn, LEDGER, ledger)
    setattr(conn, RESET_WAIT, load_settings().reset_wait_s)  # a bad setting refuses construction
    sched = impl.connector
    uncarried = alignment_problem(int(sched.block_size))
    setattr(conn, UNCARRIED, uncarried)
    if uncarried:
        logger.warning("flexkv_adapter: LoRA and cache_salt requests bypass FlexKV: %s", uncarried)
    sched._extract_namespace = namespace  # FLEXKV_REPLACED: the one namespace rule, on this instance only
    wait = sched.wait_for_all_get_tasks

    def wait_for_all_get_tasks() -> Any:
        # FLEXKV_SYNC_GET=1 (adp:1199): FlexKV's blocking wait drops the tasks (adp:756-781), so its poll never
        # reports them and the requests hang. Report what the wait returned: good loads in this step's output,
        # failed ones with this step's metadata.
        before = snapshot(sched.get_tasks)
        responses = wait()
        failed = {b for r in responses if not r.success for b in before.get(r.request.request_id, (None, ()))[1]}
        ledger.add(classify((), [r.request.request_id for r in responses], failed, before))
        return responses

    sched.wait_for_all_get_tasks = wait_for_all_get_tasks


class _Preempted:
    """The scheduler output as FlexKV's preemption handling should read it: without re-admitted requests."""

    def __init__(self, scheduler_output: Any, preempted: set[str]) -> None:
        self._output, self.preempted_req_ids = scheduler_output, preempted

    def __getattr__(self, name: str) -> Any:
        return getattr(self._output, name)


def _poll(conn: Any, ledger: Ledger) -> None:
    sched = conn._flexkv_connector.connector
    # FlexKV's poll pops the finished tasks (adp:709-718): read them from a copy (none to copy: nothing to pop)
    launched = dict(sched.get_tasks) if sched.get_tasks else {}
    sending, recving = sched.query_finished_task()
    failed = sched.get_and_clear_failed_block_ids()
    if sending or recving:  # else nothing to classify (the failed blocks are read per finished load)
        popped = launched.keys() - sched.get_tasks.keys()
        ledger.add(classify(sending, recving, set(failed), snapshot(launched, popped)))


def drain(conn: Any, ledger: Ledger) -> bool:
    """Finish FlexKV's transfers before its reset, which drops their bookkeeping; False on timeout.

    A store prepared by request_finished but not launched yet would never be reported, and vLLM
    would keep that request's blocks forever: it is launched first. Outcomes go to the ledger.
    """
    sched = conn._flexkv_connector.connector
    sched.launch_tasks()
    deadline = time.monotonic() + getattr(conn, RESET_WAIT)
    while sched.get_tasks or sched.put_tasks:
        _poll(conn, ledger)
        if not (sched.get_tasks or sched.put_tasks):
            break
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def wrappers(cls: Any) -> dict[str, Any]:
    """The replacement methods for ``cls`` (vLLM's FlexKVConnectorV1), for the :func:`applicable` names."""
    names = applicable(cls)
    orig = {name: getattr(cls, name) for name in names}

    def get_num_new_matched_tokens(self: Any, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        if bypassed(self, request) or request.request_id in getattr(self, LEDGER).no_refetch:
            return 0, False
        return orig["get_num_new_matched_tokens"](self, request, num_computed_tokens)  # type: ignore[no-any-return]

    def build_connector_meta(self: Any, scheduler_output: Any) -> Any:
        preempted = getattr(scheduler_output, "preempted_req_ids", None)
        view = scheduler_output
        if preempted:  # FlexKV's tasks to launch are read only in a step that preempted (most preempt none)
            requests = (t.request for t in self._flexkv_connector.connector.tasks_to_launch.values())
            waiting = "WAITING_FOR_REMOTE_KVS"
            readmitted = {r.request_id for r in requests if r.request_id in preempted and r.status.name == waiting}
            if readmitted:
                view = _Preempted(scheduler_output, set(preempted) - readmitted)
        orig["build_connector_meta"](self, view)  # FlexKV launches (and, with SYNC_GET, waits)
        return getattr(self, LEDGER).metadata()

    def update_connector_output(self: Any, connector_output: Any) -> None:
        ledger = getattr(self, LEDGER)
        _poll(self, ledger)
        ledger.merge_into(connector_output)

    def request_finished(self: Any, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        if getattr(self, LEDGER).finished(request.request_id):
            return True, None  # the workers report it (and its failed blocks); vLLM frees the blocks then
        tasks = self._flexkv_connector.connector.req_id_to_task_dict
        if bypassed(self, request) and request.request_id not in tasks:
            return False, None
        return orig["request_finished"](self, request, block_ids)  # type: ignore[no-any-return]

    def reset_cache(self: Any) -> bool | None:
        ledger = getattr(self, LEDGER, None)
        if ledger is None:  # worker side: FlexKV's answer (None)
            return orig["reset_cache"](self)  # type: ignore[no-any-return]
        try:
            if not drain(self, ledger):
                logger.error(
                    "flexkv_adapter: FlexKV transfers still in flight after %.0f s; FlexKV's cache was NOT reset",
                    getattr(self, RESET_WAIT),
                )
                return False
            repair_task_table(getattr(self._flexkv_connector.connector, "flexkv_manager", None))
            result = self._flexkv_connector.reset_cache()  # FlexKV's KVManager.reset and its own tables
        except Exception:
            logger.exception("flexkv_adapter: FlexKV's reset failed; its cache may still hold stale KV")
            return False
        return result is not False

    def unregister_kv_caches(self: Any) -> None:
        if not getattr(self, ASLEEP, False) and hasattr(self._flexkv_connector.connector, "_registered_kv_caches"):
            self._flexkv_connector.before_device_sleep()  # FlexKV unmaps vLLM's KV memory before vLLM frees it
            setattr(self, ASLEEP, True)

    def restore_kv_caches(self: Any) -> None:
        if getattr(self, ASLEEP, False):
            self._flexkv_connector.after_device_wake()  # re-registers through the adapter's plan (vllm._register)
            setattr(self, ASLEEP, False)

    kv_cache_access = kv_memory.kv_cache_access  # the plugin installs it as a classmethod (CLASS_METHODS)

    def _meta(self: Any) -> FlexKVAdapterMetadata:
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        return meta if isinstance(meta, FlexKVAdapterMetadata) else FlexKVAdapterMetadata()

    def get_finished(self: Any, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = orig["get_finished"](self, finished_req_ids)
        extra = _meta(self).recving
        return sending, (set(recving or ()) | extra) if (recving or extra) else None

    def get_block_ids_with_load_errors(self: Any) -> set[int]:
        return set(orig["get_block_ids_with_load_errors"](self)) | _meta(self).load_errors

    return {n: f for n, f in locals().items() if n in names}


def requires_kv_delivery(self: Any) -> bool:
    """A best-effort cache: a dropped save is a future miss (base.py:198; sched:203, 975)."""
    return False


def build_kv_connector_stats(cls: Any, data: dict[str, Any] | None = None) -> Any:
    """FlexKV's own stats type (adp:29-62), so vLLM logs what FlexKV collects (metrics.py:72-81)."""
    try:
        stats = importlib.import_module("flexkv.integration.vllm.vllm_v1_adapter")._FlexKVConnectorStats
    except Exception:
        return None
    return None if stats is None else stats(data=dict(data or {}))


__all__ = [
    "CLASS_METHODS",
    "PATCHES",
    "PROVEN",
    "PROVEN_TEXT",
    "SLEEP_HOOKS",
    "WHERE_DECLARED",
    "Poll",
    "applicable",
    "attach",
    "check_flexkv",
    "drain",
    "excluded",
    "extras",
    "namespace",
    "version_problem",
    "vllm_mismatch",
    "wrappers",
]
