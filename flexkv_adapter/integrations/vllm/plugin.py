"""vLLM 0.32-0.34 general plugin: make ``FlexKVConnectorV1`` construct, and register only what FlexKV reads right.

Entry point ``flexkv_adapter`` in group ``vllm.general_plugins``; vLLM calls :func:`install` in the
engine core and in every worker, without a ``try``. So ``install`` never raises, logs at DEBUG only,
imports neither FlexKV nor anything it does not need, and patches vLLM's ``FlexKVConnectorV1``:

- ``__init__`` keeps ``kv_cache_config`` (vLLM drops it before FlexKV sees it) in a context variable
  and, at the first construction, replaces FlexKV's ``_configure_kv_layout_from_vllm_backend``
  (which calls the ``get_kv_cache_shape`` vLLM 0.33 backends no longer have) with one that reads the
  KV cache spec: ``kv_dim=1``, ``head_size`` = the packed [K | V] cell, heads 1 for MLA and per rank
  x TP otherwise;
- ``register_kv_caches`` plans the dict (:func:`~flexkv_adapter.flexkv.vllm_plan.plan_vllm`) and
  registers that plan with FlexKV's TP client; a refusal fails start-up with the adapter's message;
- ``get_required_kvcache_layout`` states LBNHC (used when ``VLLM_KV_CACHE_LAYOUT`` is unset and the
  attention backend supports it);
- the request-lifecycle wrappers of :mod:`.lifecycle` (failed loads, reset, sleep/wake,
  ``FLEXKV_SYNC_GET``, multimodal requests), each listed there with the lines it answers; LoRA and cache_salt
  requests under a FlexKV namespace of their own (:mod:`.namespaces`, on FlexKV's ``_extract_namespace``),
  and, with the scheduler side, vLLM's ``Scheduler.reset_prefix_cache`` (:mod:`.scheduler_reset`);
- ``get_kv_connector_stats`` answers with the last interval's counts (:mod:`.stats`);
- ``kv_cache_access`` (vLLM 0.34's classmethod) answers legacy CUDA IPC, so vLLM allocates KV memory FlexKV can
  export (:mod:`.kv_memory`).

A vLLM outside :data:`.versions.PROVEN` gets the patched ``__init__`` only, which refuses with the range named.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import types
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import AdapterError, NotAddressableError
from ...model.layout import ViewKind
from . import features as vllm_features
from . import lifecycle as vllm_lifecycle
from . import scheduler_reset as vllm_scheduler_reset
from . import stats as vllm_stats

logger = logging.getLogger(__name__)

PREFERRED_LAYOUT = "LBNHC"
_CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.flexkv_connector"
_FLEXKV_CONFIG_MODULE = "flexkv.integration.config"
_MARK = "_flexkv_adapter_installed"
_kv_cache_config: contextvars.ContextVar[Any] = contextvars.ContextVar("flexkv_adapter_kv_cache_config", default=None)


def install() -> None:
    """vLLM general-plugin hook: patch ``FlexKVConnectorV1`` (idempotent; never raises)."""
    try:
        import importlib

        module = importlib.import_module(_CONNECTOR_MODULE)
        _patch_connector(module.FlexKVConnectorV1)
    except Exception as exc:  # vLLM absent or changed: leave it as it is
        logger.debug("flexkv_adapter vLLM plugin not installed: %s", exc)


def _sleep_without_hooks(cls: Any, vllm_config: Any) -> str | None:
    """Sleep mode where vLLM's connector base class has no sleep/wake hooks (vLLM 0.32): refused.

    Asleep, vLLM frees the KV memory FlexKV registered, and without ``unregister_kv_caches`` /
    ``restore_kv_caches`` nothing tells FlexKV: its workers would copy into freed or remapped memory.
    """
    if not getattr(getattr(vllm_config, "model_config", None), "enable_sleep_mode", False):
        return None
    if all(h in vllm_lifecycle.applicable(cls) for h in vllm_lifecycle.SLEEP_HOOKS):
        return None
    return (
        "enable_sleep_mode with FlexKV needs vLLM's sleep/wake connector hooks "
        f"({', '.join(vllm_lifecycle.SLEEP_HOOKS)}), which this vLLM's KVConnectorBase_V1 lacks (vLLM 0.33 and "
        "0.34 have them): asleep, vLLM would free the KV memory FlexKV copies to and from. Turn sleep mode off, or use "
        "vLLM 0.33 or 0.34"
    )


def _patch_connector(cls: Any) -> None:
    if cls.__dict__.get(_MARK):
        return
    original_init, original_register = cls.__init__, cls.register_kv_caches
    mismatch = vllm_lifecycle.vllm_mismatch(cls)

    @functools.wraps(original_init)
    def __init__(
        self: Any, vllm_config: Any, role: Any, kv_cache_config: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        if mismatch:
            raise AdapterError(
                f"flexkv_adapter: {mismatch}; the plugin was proven on {vllm_lifecycle.PROVEN_TEXT} and refuses"
            )
        vllm_features.check_options(vllm_config)
        sleeping = _sleep_without_hooks(cls, vllm_config)
        if sleeping:
            raise AdapterError(f"flexkv_adapter: {sleeping}")
        _patch_flexkv_config()
        token = _kv_cache_config.set(kv_cache_config)
        try:
            original_init(self, vllm_config, role, kv_cache_config, *args, **kwargs)
        finally:
            _kv_cache_config.reset(token)
        vllm_lifecycle.attach(self)
        vllm_stats.attach(self)
        if hasattr(self, vllm_lifecycle.LEDGER):  # the scheduler side: vLLM's Scheduler resets FlexKV's way
            vllm_scheduler_reset.install()

    @functools.wraps(original_register)
    def register_kv_caches(self: Any, kv_caches: dict[str, torch.Tensor]) -> None:
        worker = self._flexkv_connector.connector
        facts = spec_facts(self._kv_cache_config)
        tp_size = int(self._vllm_config.parallel_config.tensor_parallel_size)
        p, indexer = _plan(kv_caches, facts, tp_size)  # refuse before FlexKV sees the dict
        flexkv_config = getattr(worker, "flexkv_config", None)
        flexkv_block = getattr(getattr(flexkv_config, "cache_config", None), "tokens_per_block", None)
        flexkv_dtype = getattr(getattr(flexkv_config, "model_config", None), "dtype", None)
        if isinstance(flexkv_dtype, torch.dtype):  # FlexKV strides GPU blocks in its model dtype's units
            from ...flexkv.model import check_model_dtype

            check_model_dtype(flexkv_dtype, p.dtype, "flexkv_adapter: vLLM's KV cache (match --kv-cache-dtype)")
        if flexkv_block is not None and flexkv_block != p.tokens_per_block:
            raise AdapterError(
                f"flexkv_adapter: FlexKV counts {flexkv_block}-token blocks (vLLM's cache_config.block_size) but "
                f"the KV cache spec's block is {p.tokens_per_block} tokens; FlexKV's block ids would address the "
                f"wrong bytes"
            )
        if indexer and not _flexkv_reads_it_alike(p, next(t for n, t in kv_caches.items() if n not in indexer)):
            raise NotAddressableError(
                f"flexkv_adapter: {p} needs the adapter's registration, which does not carry DeepSeek-V3.2 indexer "
                f"caches ({', '.join(list(indexer)[:2])}, ...); set VLLM_KV_CACHE_LAYOUT=LBNHC and a --block-size "
                f"equal to the attention kernel's block size"
            )
        if not indexer:  # with indexer entries FlexKV's own registration (which splits them off) is the same plan
            worker.register_to_server = types.MethodType(
                functools.partial(_register, facts=facts, tp_size=tp_size), worker
            )
        # FlexKV's own split gets the indexer entries in the form it reads (vLLM's one-head views squeezed)
        original_register(self, {**kv_caches, **indexer})
        setattr(self, vllm_lifecycle.ASLEEP, False)  # a fresh registration (after discard) is awake

    def get_required_kvcache_layout(cls: Any, vllm_config: Any) -> str:
        return PREFERRED_LAYOUT

    cls.__init__ = __init__
    cls.register_kv_caches = register_kv_caches
    cls.get_required_kvcache_layout = classmethod(get_required_kvcache_layout)
    if not mismatch:
        for name, wrapper in vllm_lifecycle.wrappers(cls).items():
            wrapped = functools.wraps(getattr(cls, name))(wrapper)
            setattr(cls, name, classmethod(wrapped) if name in vllm_lifecycle.CLASS_METHODS else wrapped)
        cls.requires_kv_delivery = property(vllm_lifecycle.requires_kv_delivery)
        cls.build_kv_connector_stats = classmethod(vllm_lifecycle.build_kv_connector_stats)
        cls.get_kv_connector_stats = vllm_stats.wrap(cls.get_kv_connector_stats)
    setattr(cls, _MARK, True)
    logger.debug("flexkv_adapter: patched %s", cls.__qualname__)


def _patch_flexkv_config() -> None:
    """Replace FlexKV's backend-shape probe with the spec reader (FlexKV imported here, lazily)."""
    import importlib

    try:
        config_cls = importlib.import_module(_FLEXKV_CONFIG_MODULE).FlexKVConfig
    except ImportError:
        return  # vLLM's own constructor reports the missing FlexKV
    if config_cls.__dict__.get(_MARK):
        return
    original = config_cls._configure_kv_layout_from_vllm_backend

    @functools.wraps(original)
    def configure(self: Any, vllm_config: Any, vllm_kv_cache_dtype: Any) -> None:
        kv_cache_config = _kv_cache_config.get()
        if kv_cache_config is None:  # built outside vLLM's FlexKVConnectorV1: FlexKV's own way
            return original(self, vllm_config, vllm_kv_cache_dtype)  # type: ignore[no-any-return]
        facts = spec_facts(kv_cache_config)
        model = self.model_config
        model.num_kv_heads = 1 if facts["kind"] == "mla" else facts["heads"] * int(model.tp_size)
        model.head_size = facts["content"]
        model.kv_dim = 1
        logger.debug("flexkv_adapter: FlexKV layout from the KV cache spec: %s", facts)
        return None

    config_cls._configure_kv_layout_from_vllm_backend = configure
    setattr(config_cls, _MARK, True)


def spec_facts(kv_cache_config: Any) -> dict[str, Any]:
    """Kind, heads per rank, packed cell width and manager block size from vLLM's one KV cache group, whose
    spec types the feature table serves (:func:`.features.check_specs`)."""
    vllm_features.check_specs(kv_cache_config)
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) != 1:
        raise AdapterError(
            f"flexkv_adapter: FlexKV registers one KV cache group; vLLM made {len(groups)} (hybrid models need "
            f"HMA, which FlexKVConnectorV1 does not support)"
        )
    spec = groups[0].kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)
    if isinstance(per_layer, Mapping) and per_layer:  # one spec per layer: take an attention layer's
        from ...flexkv.vllm_indexer import FLEXKV_INDEXER_MARK

        spec = next((v for n, v in per_layer.items() if FLEXKV_INDEXER_MARK not in str(n)), spec)
    padding = {n: getattr(spec, n, None) for n in ("page_size_padded", "state_content_bytes", "num_head_slots")}
    padding = {n: v for n, v in padding.items() if v is not None}
    if padding:
        raise NotAddressableError(
            f"flexkv_adapter: the KV cache spec {type(spec).__name__} has padded or quantized pages ({padding}); "
            f"FlexKV layouts have no block padding, so FlexKV cannot address them. Use an unquantized, unpadded "
            f"KV cache (kv_cache_dtype auto) with FlexKVConnectorV1"
        )
    if not all(hasattr(spec, n) for n in ("num_kv_heads", "head_size", "block_size")):
        raise NotAddressableError(
            f"flexkv_adapter: the KV cache spec {type(spec).__name__} is not an attention KV cache (state-space or "
            f"linear-attention state); FlexKV offloads attention KV only"
        )
    tokens_per_state = getattr(spec, "tokens_per_state", 1)
    if tokens_per_state != 1:  # a page holds block_size / tokens_per_state states: not kernel blocks to regroup
        raise NotAddressableError(
            f"flexkv_adapter: the KV cache spec {type(spec).__name__} stores one state per {tokens_per_state} "
            f"tokens (tokens_per_state); FlexKV addresses one row per token, so its block ids would read other "
            f"blocks' states. Compressed or pooled KV caches cannot be offloaded with FlexKVConnectorV1"
        )
    kind: ViewKind = "mla" if any(c.__name__ == "MLAAttentionSpec" for c in type(spec).__mro__) else "mha"
    head_size_v = getattr(spec, "head_size_v", None)
    content = int(spec.head_size) + (int(head_size_v) if head_size_v is not None else int(spec.head_size))
    return {"kind": kind, "heads": int(spec.num_kv_heads), "content": content, "block_size": int(spec.block_size)}


def _plan(
    kv_caches: Mapping[str, torch.Tensor], facts: dict[str, Any], tp_size: int
) -> tuple[Any, dict[str, torch.Tensor]]:
    """The adapter's plan of the main KV caches, and the indexer entries as FlexKV's own split must get them."""
    from ...flexkv.vllm_indexer import check_indexer, indexer_entries
    from ...flexkv.vllm_plan import plan_vllm

    # the main KV passes the gate in plan_form; the indexer entries never reach the adapter's registration:
    # FlexKV's own register_to_server (vllm_v1_adapter.py) splits them off the dict by name and registers them,
    # so they are taken by its rule and checked against what it does with them
    indexer = indexer_entries(kv_caches)
    main = {n: t for n, t in kv_caches.items() if n not in indexer}
    # FlexKV's vLLM ModelConfig counts heads per rank x TP (what the spec reader sets): say so for MHA
    total = None if facts["kind"] == "mla" else facts["heads"] * tp_size
    p = plan_vllm(
        main,
        kind=facts["kind"],
        block_size=facts["block_size"],
        tp_size=tp_size,
        total_kv_heads=total,
        content=facts["content"],
    )
    check_indexer(indexer, num_block=p.num_block, tokens_per_block=p.tokens_per_block, main=main)
    return p, indexer


def _flexkv_reads_it_alike(p: Any, first: torch.Tensor) -> bool:
    """FlexKV's own 4-D registration of the main KV (LAYERFIRST, heads = shape[1], tokens = shape[2]) equals the
    plan; ``first``: the main KV's first entry."""
    return bool(
        p.type.value == "LAYERFIRST"
        and p.num_kv_heads == p.num_head == first.shape[1]
        and p.tokens_per_block == first.shape[2]
    )


def _register(
    worker: Any, kv_caches: Mapping[str, torch.Tensor], *, facts: dict[str, Any], tp_size: int, resume: bool = False
) -> None:
    """FlexKVWorkerConnector.register_to_server, registering the adapter's plan (also on wake)."""
    p, _ = _plan(kv_caches, facts, tp_size)
    worker.tp_client.register_to_server(kv_caches=list(p.tensors), kv_layout=p.to_flexkv(), resume=resume)
    worker._registered_kv_caches = dict(kv_caches)
    logger.debug("flexkv_adapter: registered %s", p)
