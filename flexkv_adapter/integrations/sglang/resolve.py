"""Which FlexKV connector serves SGLang 0.5.23's FlexKVRadixCache, checked before it is built.

FlexKV's connector is checked before it is built, so a FlexKV that changes a method is refused by name
instead of half-bridged; the plugin's hooks on FlexKVRadixCache are checked to be in place (SGLang logs
a hook that fails to apply and serves on).
"""

from __future__ import annotations

import importlib
import inspect
import os
import types
from dataclasses import dataclass
from typing import Any

from ...config.settings import load_settings
from ...errors import AdapterError
from .aborts import STORE_LOCKS, register_abort_hook
from .checks import installed_flexkv_api, skew_error
from .flush import PREFIX, register_radix_hooks
from .lookups import register_lookup_hooks
from .namespaces import register_namespace_hooks

FLEXKV_CONNECTOR_MODULE = "flexkv.integration.sglang.connector"
FLEXKV_COMM_MODULE = "flexkv.integration.sglang.comm"
LAYERWISE_ENV = "FLEXKV_ENABLE_LAYERWISE_TRANSFER"
HANDLE_MODULE = "sglang.srt.mem_cache.base_prefix_cache"
RADIX_MODULE = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache"
# The plugin's hooks on FlexKVRadixCache: (module of the hook, methods, what goes wrong without them,
# whether ``sglang_namespaced_requests: shared`` turns them off). Each module is read off the function that
# registers its hooks, so a move or rename cannot leave a stale path behind.
RADIX_HOOKS = (
    (register_namespace_hooks.__module__, ("match_prefix", "checkpoint"), "LoRA / cache_salt requests "
     "would share KV across namespaces", True),
    (register_abort_hook.__module__, ("release_aborted_request",), "an aborted request's slots could "
     "be reused while FlexKV still stores them", False),
    (register_radix_hooks.__module__, ("__init__", "init_load_back", "reset"), "slots FlexKV may still "
     "write could be reused, a reused rid could keep a lock forever, a flush could leave stale KV in FlexKV", False),
    (register_lookup_hooks.__module__, ("match_prefix", "on_release"), "a FlexKV lookup held for a request "
     "admitted without a load, or finished, would pin FlexKV's CPU blocks until the next flush", False),
)  # fmt: skip
LOCKLESS = "the abort hook could keep no in-flight store's lock"
WORKING_FLEXKV = (
    "FlexKV b70205e (SGLang's in-tree connector), or FlexKV 94915c4 or later up to 34ab141 (tested) with its own "
    "connector (flexkv.integration.sglang.connector, bridged by this plugin)"
)

# Leading parameters (after self), in order, that SGLang 0.5.23's calls bind to; "rid" receives the key.
CALLS: dict[str, tuple[str, ...]] = {
    "lookup_kv": ("token_ids", "token_mask", "rid"),
    "store_kv": ("rid", "token_ids", "kv_indices"),
    "retrieve_kv": ("rid", "slot_mapping"),
    "start_load_kv_layerwise": ("rid", "slot_mapping"),
    "release_pending": ("rid",),
    "prefetch_async": ("rid", "token_ids"),
    "check_prefetch_progress": ("rid",),
    "cancel_prefetch": ("rid",),
    "check_completed_stores": (),
    "drain_launched_loads": (),
    "register_layer_transfer_counter": ("kvcache",),
    "reset": (),
    "shutdown": (),
}
# What FlexKVRadixCache passes to the connector's constructor (all by keyword).
INIT_KEYWORDS = (
    "sgl_model_config", "server_args", "page_size", "kvcache", "tp_rank", "dp_rank", "pp_rank",
    "attn_cp_rank", "pp_group", "attn_tp_group", "attn_cp_group",
)  # fmt: skip


def handle_key(handle: Any) -> str:
    """FlexKV's ``rid`` for a ``CacheRequestHandle``: deterministic, injective (parsed from the right)."""
    return f"{handle.rid}@attempt{int(handle.attempt_id)}"


def _method_problem(cls: type, name: str, leading: tuple[str, ...]) -> str | None:
    fn = inspect.getattr_static(cls, name, None)
    if fn is None or not callable(fn):
        return f"{name}() is missing"
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional[: len(leading)] != list(leading):
        return f"{name}() takes ({', '.join(positional)}) where ({', '.join(leading)}) is expected first"
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    extra = [n for n in required if n not in leading]
    return f"{name}() requires {extra}, which SGLang does not pass" if extra else None


@dataclass(frozen=True)
class ConnectorShape:
    """FlexKV's connector class, checked; which methods also take ``sglang_req_id`` (for FlexKV's logs)."""

    cls: type
    takes_req_id: frozenset[str]


def check_connector(cls: type) -> ConnectorShape:
    """Refuse, naming the method, a FlexKV connector that does not answer a call SGLang 0.5.23 makes."""
    problems = [p for name, leading in CALLS.items() if (p := _method_problem(cls, name, leading))]
    init = inspect.signature(inspect.getattr_static(cls, "__init__")).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in init.values()):
        missing = [k for k in INIT_KEYWORDS if k not in init]
        if missing:
            problems.append(f"__init__() does not take {missing}")
    required = [
        n for n, p in list(init.items())[1:] if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if extra := [n for n in required if n not in INIT_KEYWORDS]:
        problems.append(f"__init__() requires {extra}, which SGLang does not pass")
    if problems:
        raise AdapterError(
            f"FlexKV's own SGLang connector ({cls.__module__}.{cls.__qualname__}) does not answer every call "
            f"SGLang 0.5.23's FlexKVRadixCache makes: {'; '.join(problems)}. Working FlexKV versions: {WORKING_FLEXKV}"
        )
    takes = frozenset(n for n in ("lookup_kv", "store_kv", "prefetch_async") if "sglang_req_id" in _params(cls, n))
    return ConnectorShape(cls, takes)


def _params(cls: type, name: str) -> Any:
    return inspect.signature(inspect.getattr_static(cls, name)).parameters


def hooked_by(fn: Any, module: str) -> bool:
    """Whether a HookRegistry wrapper around ``fn`` (its closure, down the ``__wrapped__`` chain) calls ``module``:
    the hook itself, or a function its own closure holds (a hook run inside another's, :func:`.lookups.match_hook`)."""
    while fn is not None:
        for held in _closed_over(fn):
            if getattr(held, "__module__", None) == module or (
                type(held) is types.FunctionType
                and any(getattr(inner, "__module__", None) == module for inner in _closed_over(held))
            ):
                return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _closed_over(fn: Any) -> list[Any]:
    """What ``fn``'s closure holds (empty cells left out)."""
    held = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return held


def missing_radix_hooks() -> list[str]:
    """The plugin's FlexKVRadixCache hooks that are not in place (SGLang logs a hook that fails to apply and
    serves on), each with what goes wrong without it."""
    shared = load_settings().sglang_namespaced_requests == "shared"
    radix = importlib.import_module(RADIX_MODULE).FlexKVRadixCache
    init = getattr(inspect.unwrap(radix.__init__), "__code__", None)
    unset = [n for n in STORE_LOCKS if n not in getattr(init, "co_names", ())]  # what the abort hook reads
    return [
        f"FlexKVRadixCache.{m} ({harm})"
        for module, methods, harm, optional in RADIX_HOOKS
        if not (optional and shared)
        for m in methods
        if not hooked_by(getattr(radix, m, None), module)
    ] + [f"FlexKVRadixCache.release_aborted_request (its __init__ sets no {' or '.join(unset)}: {LOCKLESS})"] * bool(
        unset
    )


def resolve_connector(environ: Any = os.environ) -> tuple[ConnectorShape, str]:
    """FlexKV's connector if the in-tree one is skewed and FlexKV's answers SGLang; else the refusal."""
    if environ.get(LAYERWISE_ENV, "0").strip() not in ("", "0"):
        raise AdapterError(
            f"{LAYERWISE_ENV}={environ[LAYERWISE_ENV]}: SGLang's layerwise FlexKV path (synthetic per-process "
            f"handles, start_load_kv_layerwise) is not proven through the bridge; unset it to serve synchronously"
        )
    api = installed_flexkv_api()
    skew = skew_error(api)
    if skew is None:
        raise AdapterError(
            "the installed FlexKV matches SGLang's in-tree connector and also ships its own SGLang connector; "
            f"this combination is unproven and not served. Working FlexKV versions: {WORKING_FLEXKV}"
        )
    try:
        module = importlib.import_module(FLEXKV_CONNECTOR_MODULE)
        shape = check_connector(module.FlexKVConnector)
        if not hasattr(importlib.import_module(FLEXKV_COMM_MODULE).FlexKVScatterChannel, "STORE_START"):
            raise AdapterError(
                "FlexKV's own connector predates FlexKV 94915c4 (#263, no STORE_START scatter channel): at TP > 1 its "
                "non-leader ranks return -1 from store_kv and SGLang frees the slots while the host copy still reads "
                f"them. Working FlexKV versions: {WORKING_FLEXKV}"
            )
    except (ImportError, AttributeError) as exc:
        raise AdapterError(f"{skew}. FlexKV's own connector cannot be used: {type(exc).__name__}: {exc}") from exc
    except AdapterError as exc:
        raise AdapterError(f"{skew}. {exc}") from exc
    return shape, "; ".join(api.in_tree_mismatches())


__all__ = ["CALLS", "ConnectorShape", "PREFIX", "RADIX_HOOKS", "check_connector", "handle_key", "hooked_by",
           "missing_radix_hooks", "resolve_connector"]  # fmt: skip
