"""No FlexKV hits across namespaces: requests with a LoRA (``extra_key``), a ``cache_salt`` or multimodal inputs
bypass FlexKV.

SGLang's FlexKVRadixCache hands the connector token ids only, while a LoRA id lives in the request's
``extra_key`` and ``cache_salt`` is separate: two tenants with the same prompt would share KV. By
default such requests neither look up nor store in FlexKV (the device radix tree still keys them
apart); ``sglang_namespaced_requests: shared`` restores SGLang's behaviour, with that risk.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ...config.settings import AdapterSettings
from .flush import PREFIX

logger = logging.getLogger(__name__)

RADIX_CLASS = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache.FlexKVRadixCache"


def namespaced(obj: Any) -> bool:
    """A request or radix key that carries a LoRA id (extra_key), a cache_salt, or multimodal inputs (whose pad
    ids FlexKV's token-id key was never proven to tell apart): it bypasses FlexKV."""
    return obj is not None and (
        getattr(obj, "extra_key", None) is not None
        or bool(getattr(obj, "cache_salt", None))
        or getattr(obj, "multimodal_inputs", None) is not None
    )


def _base(self: Any) -> Any:
    """RadixCache's methods for this FlexKVRadixCache (the class after it in the MRO)."""
    module, name = RADIX_CLASS.rsplit(".", 1)
    cls: Any = getattr(importlib.import_module(module), name)
    return super(cls, self)


def match_prefix(original: Any, self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    """Device-tree match only (RadixCache's) for a namespaced key or request: no FlexKV lookup."""
    if namespaced(getattr(params, "key", None)) or namespaced(getattr(params, "req", None)):
        return _base(self).match_prefix(params, *args, **kwargs)
    return original(self, params, *args, **kwargs)


def checkpoint(original: Any, self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """RadixCache's checkpoint only for a namespaced request: no FlexKV store."""
    if namespaced(req):
        return _base(self).checkpoint(req, *args, **kwargs)
    return original(self, req, *args, **kwargs)


def register_namespace_hooks(registry: Any, hook_type: Any, settings: AdapterSettings) -> list[str]:
    """AROUND hooks on FlexKVRadixCache's match and store paths, unless the setting shares namespaces."""
    if settings.sglang_namespaced_requests == "shared":
        logger.warning(
            "%s: sglang_namespaced_requests=shared: requests with a LoRA or cache_salt look up and store FlexKV KV "
            "by token ids alone and can hit another tenant's KV",
            PREFIX,
        )
        return []
    registry.register(f"{RADIX_CLASS}.match_prefix", match_prefix, hook_type.AROUND)
    registry.register(f"{RADIX_CLASS}.checkpoint", checkpoint, hook_type.AROUND)
    return [f"{RADIX_CLASS}.match_prefix/.checkpoint (LoRA and cache_salt requests bypass FlexKV)"]
