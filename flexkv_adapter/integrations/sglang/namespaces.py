"""FlexKV namespaces for SGLang requests with a caller ``extra_key``, a LoRA or a ``cache_salt``; multimodal requests
bypass FlexKV.

SGLang's FlexKVRadixCache hands FlexKV's connector token ids only (flexkv_radix_cache.py:204-206, 425-429), while
SGLang keys its own tree by ``extra_key`` and ``cache_salt`` too: two tenants with the same prompt would share KV.
The setting ``sglang_namespaced_requests`` chooses:

* ``namespaced`` (default): around SGLang's ``match_prefix`` and ``checkpoint``, the request's namespace (a digest
  of its tagged extras: :mod:`flexkv_adapter.flexkv.namespace`) is set on the bridge's recorder, which hands it to
  FlexKV's ``get_match``/``put_match``. The extras come from the request, not from its joined key: SGLang appends
  ``lora_id`` to ``extra_key`` with no separator (schedule_batch.py:1165-1168). Bypassed per request where it
  cannot be carried: SGLang's in-tree connector (no recorder), a match without a request (the layerwise path), a
  block size the namespace could align with;
* ``skip``: such requests neither look up nor store in FlexKV (the device tree still keys them apart);
* ``shared``: SGLang's own behaviour, by token ids alone, with that risk.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ...config.settings import AdapterSettings
from ...errors import AdapterError
from ...flexkv.namespace import Extra, alignment_problem, namespace_of
from .flush import PREFIX

logger = logging.getLogger(__name__)

RADIX_CLASS = "sglang.srt.mem_cache.storage.flexkv.flexkv_radix_cache.FlexKVRadixCache"
CARRIES = "carries_namespaces"  # a connector class attribute: its recorder hands a set namespace to FlexKV


class Uncarried(Exception):
    """The request has a namespace this connector cannot hand to FlexKV: it bypasses FlexKV."""


def multimodal(obj: Any) -> bool:
    """Multimodal inputs, whose pad ids FlexKV's token-id key was never proven to tell apart: always bypassed."""
    return obj is not None and getattr(obj, "multimodal_inputs", None) is not None


def namespaced(obj: Any) -> bool:
    """A request or radix key with an ``extra_key`` (a caller's, or a LoRA id), a LoRA id, a ``cache_salt``, or
    multimodal inputs (inline: every match and store asks). A slotted type that can hold only the first two
    (SGLang's RadixKey) is read for those two: a missing attribute's default costs an AttributeError each time."""
    if obj is None:
        return False
    if getattr(obj, "extra_key", None) is not None or bool(getattr(obj, "cache_salt", None)):
        return True
    cls = type(obj)
    two = _TWO_FIELDS.get(cls) if type(cls) is type else False  # a metaclass's own __eq__/__hash__ never keys it
    if two is None:
        two = _TWO_FIELDS.setdefault(cls, _holds_two_fields(cls))
    return not two and (multimodal(obj) or getattr(obj, "lora_id", None) is not None)


_TWO_FIELDS: dict[type, bool] = {}  # by type: whether only extra_key and cache_salt can be set on its instances


def _holds_two_fields(cls: type) -> bool:
    """Instances without a ``__dict__``, of a plain class (metaclass ``type``) whose MRO defines no ``__getattr__``,
    ``__getattribute__``, ``multimodal_inputs`` or ``lora_id`` (slot, descriptor or value): those two can never be
    read from them. Classified once per type, at its first match: a class given such a name later is misread."""
    own = {name for k in cls.__mro__ for name in vars(k) if k is not object}
    return (
        type(cls) is type
        and getattr(cls, "__dictoffset__", 1) == 0
        and not own & {"__getattr__", "__getattribute__", "multimodal_inputs", "lora_id"}
    )


def extras(req: Any) -> list[Extra]:
    """The request's tagged extras: the caller's ``extra_key``, its LoRA id, its salt (an empty salt is none, as
    SGLang reads it). SGLang's tree keys ``extra_key=""`` apart from none (radix_cache.py:223-247), except
    beside a LoRA id, where its joined key is the same for both. Raises :class:`Uncarried` where the joined key
    does not end with the LoRA id."""
    lora_id, joined = getattr(req, "lora_id", None), getattr(req, "extra_key", None)
    salt, caller = getattr(req, "cache_salt", None), joined
    if lora_id is not None:
        if type(lora_id) is not str or type(joined) is not str or not joined.endswith(lora_id):
            raise Uncarried(f"extra_key {joined!r} does not end with lora_id {lora_id!r}")
        caller = joined[: len(joined) - len(lora_id)] or None
    found: list[Extra] = [("extra_key", caller)] if caller is not None else []
    found += [("lora", lora_id)] if lora_id is not None else []
    return found + ([("cache_salt", salt)] if salt else [])


def namespace_for(radix: Any, req: Any) -> list[str] | None:
    """FlexKV's namespace for the request on this radix cache; :class:`Uncarried` where it cannot be carried."""
    try:
        namespace = namespace_of(extras(req))
    except TypeError as exc:  # a field that is not a plain str (a subclass could read two ways)
        raise Uncarried(str(exc)) from exc
    if namespace is None:
        return None
    connector = getattr(radix, "flexkv_connector", None)
    if getattr(type(connector), CARRIES, False) is not True:
        raise Uncarried("SGLang's in-tree connector serves FlexKV here, which takes no namespace")
    if getattr(connector, "leader", False) and getattr(connector, "observed", None) is None:
        raise Uncarried("the TP leader's FlexKV connector has no KVManager recorder to hand the namespace to")
    if problem := alignment_problem(int(radix.page_size)):
        raise Uncarried(problem)
    return namespace


def _base(self: Any) -> Any:
    """RadixCache's methods for this FlexKVRadixCache (the class after it in the MRO)."""
    module, name = RADIX_CLASS.rsplit(".", 1)
    cls: Any = getattr(importlib.import_module(module), name)
    return super(cls, self)


def _carried(radix: Any, namespace: list[str] | None, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call`` with ``namespace`` set on the bridge's recorder (the leader's; other ranks reach no KVManager)."""
    observed = getattr(radix.flexkv_connector, "observed", None)
    if namespace is None or observed is None:
        return call(*args, **kwargs)
    outer = observed.namespace
    if outer is not None and outer != namespace:  # a nested call of another request: never run under the wrong one
        raise AdapterError(f"{PREFIX}: a FlexKV call for one namespace nested in another's")
    observed.namespace = namespace
    try:
        return call(*args, **kwargs)
    finally:
        observed.namespace = outer


def _uncarried(req: Any, why: str) -> None:
    logger.debug("%s: request %s bypasses FlexKV: %s", PREFIX, getattr(req, "rid", "?"), why)


def match_prefix(original: Any, self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    """FlexKV's lookup under the request's namespace; the device tree only (RadixCache's) where none is carried."""
    req, key = getattr(params, "req", None), getattr(params, "key", None)
    if not namespaced(req) and not namespaced(key):  # a plain request (nearly every one): FlexKV's own path
        return original(self, params, *args, **kwargs)
    if multimodal(req) or multimodal(key) or (req is None and namespaced(key)):
        return _base(self).match_prefix(params, *args, **kwargs)
    try:
        namespace = namespace_for(self, req) if req is not None else None
    except Uncarried as why:
        _uncarried(req, str(why))
        return _base(self).match_prefix(params, *args, **kwargs)
    return _carried(self, namespace, original, self, params, *args, **kwargs)


def checkpoint(original: Any, self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """FlexKV's store under the request's namespace; RadixCache's checkpoint only where none is carried."""
    if not namespaced(req):  # a plain request: FlexKV's own path
        return original(self, req, *args, **kwargs)
    if multimodal(req):
        return _base(self).checkpoint(req, *args, **kwargs)
    try:
        namespace = namespace_for(self, req)
    except Uncarried as why:
        _uncarried(req, str(why))
        return _base(self).checkpoint(req, *args, **kwargs)
    return _carried(self, namespace, original, self, req, *args, **kwargs)


def skip_match_prefix(original: Any, self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    """``skip``: device-tree match only (RadixCache's) for a namespaced key or request: no FlexKV lookup."""
    if namespaced(getattr(params, "key", None)) or namespaced(getattr(params, "req", None)):
        return _base(self).match_prefix(params, *args, **kwargs)
    return original(self, params, *args, **kwargs)


def skip_checkpoint(original: Any, self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """``skip``: RadixCache's checkpoint only for a namespaced request: no FlexKV store."""
    if namespaced(req):
        return _base(self).checkpoint(req, *args, **kwargs)
    return original(self, req, *args, **kwargs)


HOOKS = {"namespaced": (match_prefix, checkpoint), "skip": (skip_match_prefix, skip_checkpoint)}
WHAT = {
    "namespaced": "LoRA, extra_key and cache_salt requests under a FlexKV namespace of their own",
    "skip": "LoRA, extra_key and cache_salt requests bypass FlexKV",
}


def match_hook(settings: AdapterSettings) -> Any:
    """The AROUND hook on ``match_prefix`` for the setting (None for ``shared``). :mod:`.lookups` registers it inside
    its own hook on that method: one hook layer on SGLang's hottest call, not two."""
    mode = settings.sglang_namespaced_requests
    return None if mode == "shared" else HOOKS[mode][0]


def register_namespace_hooks(registry: Any, hook_type: Any, settings: AdapterSettings) -> list[str]:
    """The AROUND hook on FlexKVRadixCache's store path, unless the setting shares namespaces (its match path:
    :func:`match_hook`)."""
    mode = settings.sglang_namespaced_requests
    if mode == "shared":
        logger.warning(
            "%s: sglang_namespaced_requests=shared: requests with a LoRA, extra_key or cache_salt look up and store "
            "FlexKV KV by token ids alone and can hit another tenant's KV",
            PREFIX,
        )
        return []
    registry.register(f"{RADIX_CLASS}.checkpoint", HOOKS[mode][1], hook_type.AROUND)
    return [f"{RADIX_CLASS}.match_prefix/.checkpoint ({WHAT[mode]}; multimodal requests bypass FlexKV)"]
