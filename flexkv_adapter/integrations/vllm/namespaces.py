"""Which vLLM requests FlexKV serves, and under which FlexKV namespace.

vLLM keys its prefix cache by token ids plus tagged extras (kv_cache_utils.py:590-607, 659-669): a LoRA's
``("lora", name, path)``, ``("cache_salt", salt)``, multimodal inputs and prompt embeds. LoRA and salt are
carried into FlexKV as one digest namespace (:mod:`flexkv_adapter.flexkv.namespace`), in place of FlexKV's
own untagged ``[lora_name, cache_salt]`` (adp:344-390), under which LoRA ``t1`` and salt ``t1`` share KV, and
so does one LoRA name over two adapter paths. Multimodal and prompt-embeds requests bypass FlexKV.
"""

from __future__ import annotations

from typing import Any

from ...flexkv.namespace import Extra, namespace_of

UNCARRIED = "_flexkv_adapter_namespaces_uncarried"  # on the connector: why LoRA/salt requests bypass FlexKV, or None


def excluded(request: Any) -> bool:
    """A request FlexKV's key cannot tell apart from another that vLLM keeps apart: FlexKV is skipped for it.

    vLLM keys its prefix cache by multimodal inputs and prompt embeds too (kv_cache_utils.py:659-669), which no
    FlexKV namespace was proven to carry. LoRA and cache_salt requests are carried (:func:`namespace`), except
    on a connector whose block size a namespace cannot be kept apart at (:data:`UNCARRIED`).
    """
    return bool(getattr(request, "mm_features", None)) or getattr(request, "prompt_embeds", None) is not None


def extras(request: Any) -> list[Extra]:
    """vLLM's own tagged extras for the request's LoRA and salt (kv_cache_utils.py:590-607, 659-662)."""
    found: list[Extra] = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        found.append(("lora", lora.lora_name, lora.lora_path))
    salt = getattr(request, "cache_salt", None)
    if salt:  # vLLM reads an empty salt as none (kv_cache_utils.py:661)
        found.append(("cache_salt", salt))
    return found


def namespace(request: Any) -> list[str] | None:
    """FlexKV's namespace for the request, replacing FlexKV's ``_extract_namespace`` (adp:344-390), whose untagged
    ``[lora_name, cache_salt]`` lets LoRA ``t1`` and salt ``t1`` share KV, and one LoRA name over two paths."""
    return namespace_of(extras(request))


def bypassed(conn: Any, request: Any) -> bool:
    """Whether FlexKV is skipped for the request on this connector: also where its extras cannot be encoded
    one-to-one (a name that is not a plain ``str``), which would otherwise raise inside FlexKV's lookup."""
    if excluded(request):
        return True
    found = extras(request)
    if not found:
        return False
    if getattr(conn, UNCARRIED) is not None:
        return True
    try:
        namespace_of(found)
    except TypeError:
        return True
    return False


__all__ = ["UNCARRIED", "bypassed", "excluded", "extras", "namespace"]
