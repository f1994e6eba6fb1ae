"""SGLang drop-in: ``SGLANG_PLUGINS=flexkv_adapter`` makes ``--enable-flexkv`` adapt the pool, with no engine edits.

SGLang (>= 0.5.23) loads entry points of group ``sglang.srt.plugins`` in every process and applies
the hooks they register. :func:`install` registers, only when the user opted in and FlexKV is
installed:

* a BEFORE hook on ``__init__`` of SGLang's in-tree ``FlexKVConnector`` and of FlexKV's own: the
  ``kvcache`` argument is replaced by ``adapt(kvcache, page_size=..., kind=<from the model>)``
  after the checks in :mod:`.checks` (and, for FlexKV's own, :mod:`.refusals`); a
  refusal raises at engine start, prefixed with what the plugin was doing;
* when both connectors exist and SGLang has ``FlexKVRadixCache``: a class REPLACE of the in-tree
  ``FlexKVConnector`` (the name ``flexkv_radix_cache.py:45`` imports and ``:99`` builds) by
  :class:`.bridge.BridgeConnector`, which serves with FlexKV's own connector, translating
  ``handle=`` (``:204``, ``:250``, ``:425``, positional elsewhere) and ``check_completed_stores``
  (``:468``); the in-tree ``__init__`` hook is then not registered;
* AROUND hooks on ``FlexKVRadixCache.match_prefix`` (``:156``) and ``.checkpoint`` (``:382``):
  requests with a LoRA, extra_key or cache_salt use FlexKV under a namespace of their own, multimodal ones
  bypass it (:mod:`.namespaces`);
* an AROUND hook on ``FlexKVRadixCache.release_aborted_request`` (``:481``): an aborted request's
  store that FlexKV still copies keeps its radix lock until it completes (:mod:`.aborts`);
* AFTER hooks on ``FlexKVRadixCache.match_prefix`` (``:196-197``, ``:207-208`` return without releasing
  the lookup an earlier match held) and ``.on_release`` (``:378-380`` releases none): a FlexKV lookup
  that no load will use is released, so its get task does not pin FlexKV's CPU blocks (:mod:`.lookups`);
* an AFTER hook on ``FlexKVRadixCache.__init__`` (the bridge learns its radix cache) and AROUND hooks on
  ``.init_load_back`` (slots FlexKV may still write stay quarantined) and ``.reset`` (FlexKV is emptied
  first, or the flush fails), and in the scheduler process an AROUND hook on ``Scheduler.flush_cache``
  that reports such a failure as False (:mod:`.flush`);
* with ``remote: external``, a replacement of ``TransferManagerOnRemote.create_process`` that waits
  for ``scripts/start_remote.py`` instead of spawning a second remote (:mod:`.external_remote`).

FlexKV's own state is changed in two places only: its task table before a reset (``flexkv_adapter.flexkv.reset``,
kvtask.py:212, :1461) and a task whose launch raised after FlexKV marked it running, put back to ready before
its cancel (:mod:`.unlaunched`, kvtask.py:740-748, :815-830).

``apply_hooks()`` imports every hooked target, FlexKV's compiled extension included, so nothing
is hooked without the opt-in, and modules are looked up without importing them.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from ...config.settings import AdapterSettings, load_settings
from ...errors import AdapterError, SettingsError
from ...model.hybrid import HybridPoolError
from ...model.views import PoolView
from .aborts import register_abort_hook
from .bridge import PREFIX, BridgeConnector
from .checks import (
    check_pool_kind,
    check_view,
    connector_facts,
    hybrid_message,
    installed_flexkv_api,
    skew_error,
)
from .external_remote import ExternalRemote, wait_for_start_remote
from .flush import SCHEDULER_MODULE, register_radix_hooks
from .lookups import register_lookup_hooks
from .namespaces import match_hook, register_namespace_hooks
from .refusals import option_refusal, start_refusal

logger = logging.getLogger(__name__)

PLUGIN_NAME = "flexkv_adapter"
OPT_IN_ENV = "FLEXKV_ADAPTER_SGLANG"
IN_TREE_CONNECTOR = "sglang.srt.mem_cache.storage.flexkv.flexkv_connector.FlexKVConnector"
FLEXKV_CONNECTOR = "flexkv.integration.sglang.connector.FlexKVConnector"
IN_TREE_MODULE = IN_TREE_CONNECTOR.rsplit(".", 1)[0]
RADIX_MODULE = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache"
CREATE_PROCESS = "flexkv.transfer_manager.TransferManagerOnRemote.create_process"


def opted_in(environ: Any = os.environ) -> bool:
    """``SGLANG_PLUGINS`` names this plugin, or ``FLEXKV_ADAPTER_SGLANG=1``."""
    named = {n.strip() for n in environ.get("SGLANG_PLUGINS", "").split(",")}
    return PLUGIN_NAME in named or environ.get(OPT_IN_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def module_exists(name: str) -> bool:
    """Whether ``name`` can be found, without importing it or its parent packages."""
    top, *rest = name.split(".")
    try:
        spec = sys.modules[top].__spec__ if top in sys.modules else importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    prefix = top
    for part in rest:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False
        prefix = f"{prefix}.{part}"
        loaded = sys.modules.get(prefix)
        spec = loaded.__spec__ if loaded is not None else importlib.machinery.PathFinder.find_spec(prefix, locations)
    return spec is not None


def _prefixed(exc: AdapterError, doing: str) -> AdapterError:
    """The same error class, its text prefixed with what the plugin was doing."""
    message = f"{PREFIX}, {doing}: {exc}"
    try:
        return type(exc)(message)
    except TypeError:
        return AdapterError(message)


def prepare_kvcache(settings: AdapterSettings, connector: str, in_tree: bool, kwargs: dict[str, Any]) -> PoolView:
    """The view the connector receives instead of SGLang's pool, or an error that stops the engine."""
    doing = f"adapting the KV pool for {connector}"
    try:
        api = installed_flexkv_api()
        args = kwargs.get("server_args")
        error = (skew_error(api) or option_refusal(args)) if in_tree else start_refusal(kwargs.get("kvcache"), args)
        if error is not None:
            raise error
        missing = [k for k in ("kvcache", "sgl_model_config", "server_args", "page_size") if k not in kwargs]
        if missing:
            raise AdapterError(f"the connector was built without keyword argument(s) {missing}")
        page_size, pool = int(kwargs["page_size"]), kwargs["kvcache"]
        if settings.page_size is not None and settings.page_size != page_size:
            raise AdapterError(f"settings page_size={settings.page_size} but SGLang's page size is {page_size}")
        facts = connector_facts(kwargs["sgl_model_config"], kwargs["server_args"], int(kwargs.get("pp_rank") or 0), api)
        if isinstance(pool, PoolView):
            view = pool
            if view.whole is not None:  # FlexKV's connector registers only kv_buffer / k_buffer+v_buffer
                raise HybridPoolError(f"{view!r} is {view.whole.describe()}; the connector would register the KV alone")
            if view.kind != facts.kind:
                raise AdapterError(f"{pool!r} is an {view.kind.upper()} view but the model is {facts.kind.upper()}")
        else:
            check_pool_kind(pool, facts)
            try:
                view = adapt_pool(pool, page_size, facts.kind)
            except HybridPoolError:
                raise HybridPoolError(hybrid_message(pool, facts, settings.hybrid)) from None
        check_view(view, facts, page_size)
    except AdapterError as exc:
        raise _prefixed(exc, doing) from exc
    logger.info("%s: %s: %s", PREFIX, connector, "; ".join(line.strip() for line in str(view.report).splitlines()))
    return view


def adapt_pool(pool: object, page_size: int, kind: str) -> PoolView:
    from ...pipeline.adapting import adapt

    return adapt(pool, page_size=page_size, kind=kind, hybrid="error")  # type: ignore[arg-type]


def _before_init(settings: AdapterSettings, target: str) -> Callable[..., Any]:
    def before_init(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The skew check is for SGLang's own copy only; a release whose in-tree name re-exports FlexKV's class
        # is FlexKV's connector and must not be refused for it.
        in_tree = bool(args) and any(c.__module__ == IN_TREE_MODULE for c in type(args[0]).__mro__)
        kwargs["kvcache"] = prepare_kvcache(settings, target, in_tree, kwargs)
        return args, kwargs

    return before_init


def _refuse_settings(error: AdapterError) -> Callable[..., Any]:
    """Fail closed: settings that did not load (e.g. an intended remote: external) stop the engine."""

    def before_init(*args: Any, **kwargs: Any) -> None:
        raise _prefixed(error, "loading its settings (FLEXKV_ADAPTER_* variables, FLEXKV_ADAPTER_CONFIG)")

    return before_init


def _create_process(settings: AdapterSettings) -> Callable[..., ExternalRemote]:
    def create_process(*args: Any, **kwargs: Any) -> ExternalRemote:
        try:
            return wait_for_start_remote(settings, str(kwargs.get("master_host")), kwargs.get("master_ports"))
        except AdapterError as exc:
            raise _prefixed(exc, "remote: external, instead of FlexKV spawning TransferManagerOnRemote") from exc

    return create_process


def install() -> None:
    """Entry point (group ``sglang.srt.plugins``): register the hooks; import nothing of FlexKV."""
    if not opted_in():
        logger.debug("%s: not enabled (set SGLANG_PLUGINS=%s or %s=1)", PREFIX, PLUGIN_NAME, OPT_IN_ENV)
        return
    if not module_exists("flexkv.server.client"):  # not just "flexkv": a folder of that name in the cwd is not FlexKV
        logger.info("%s: FlexKV is not installed; nothing to hook", PREFIX)
        return
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    HookRegistry, HookType = hooks.HookRegistry, hooks.HookType

    connectors = [t for t in (IN_TREE_CONNECTOR, FLEXKV_CONNECTOR) if module_exists(t.rsplit(".", 1)[0])]
    try:
        settings = load_settings()
    except Exception as exc:  # fail closed: SGLang would log anything raised here and run without hooks
        if not isinstance(exc, AdapterError):
            exc = SettingsError(f"cannot read the settings: {type(exc).__name__}: {exc}")
        logger.error("%s: settings failed to load; FlexKV connectors will refuse to start: %s", PREFIX, exc)
        for target in connectors:
            HookRegistry.register(f"{target}.__init__", _refuse_settings(exc), HookType.BEFORE)
        return
    hooked = []
    if len(connectors) == 2 and module_exists(RADIX_MODULE):  # SGLang's radix cache may need FlexKV's connector
        HookRegistry.register(IN_TREE_CONNECTOR, BridgeConnector, HookType.REPLACE)
        hooked.append(f"{IN_TREE_CONNECTOR} (bridged to FlexKV's own connector where the in-tree one is skewed)")
        connectors.remove(IN_TREE_CONNECTOR)
    for target in connectors:
        HookRegistry.register(f"{target}.__init__", _before_init(settings, target), HookType.BEFORE)
    hooked += [f"{t}.__init__" for t in connectors]
    if module_exists(RADIX_MODULE):
        hooked += register_namespace_hooks(HookRegistry, HookType, settings)
        hooked += register_abort_hook(HookRegistry, HookType)
        hooked += register_lookup_hooks(HookRegistry, HookType, match_hook(settings))
        hooked += register_radix_hooks(HookRegistry, HookType, SCHEDULER_MODULE in sys.modules)
    if settings.remote == "external" and module_exists(CREATE_PROCESS.rsplit(".", 2)[0]):
        HookRegistry.register(CREATE_PROCESS, _create_process(settings), HookType.REPLACE)
        hooked.append(f"{CREATE_PROCESS} (remote: external)")
    logger.info("%s: hooking %s", PREFIX, ", ".join(hooked) or "nothing (no FlexKV connector module found)")


__all__ = ["install", "module_exists", "opted_in", "prepare_kvcache"]
