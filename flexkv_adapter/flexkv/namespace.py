"""FlexKV's one namespace component for a request its engine keys apart: a fixed-length digest of tagged extras.

FlexKV hashes a namespace ahead of the token ids: its components joined with NUL, each UTF-8 byte fed to
the hash as one int64 (flexkv/common/block.py:11-20, 80-90), then the token ids block by block into the
same stream, digested after each block (hash_utils.gen_hashes). Two hazards follow, both answered here:

* the join is not one-to-one: ``["a", "b"]`` and ``["a\\x00b"]`` hash alike, and so would a LoRA name or
  path holding a NUL. One component, a digest of a one-to-one encoding (JSON) of the tagged tuples, is.
* a namespace of L bytes hashes like L token ids, so a plain prompt that starts with those L values gets the
  namespaced request's block hashes (shifted by L tokens) wherever L is a multiple of FlexKV's
  ``tokens_per_block``. FlexKV's radix index walks from its root and would not serve them; an index keyed by
  block hash alone would. The component is :data:`COMPONENT_LEN` = 61 characters, a prime: only blocks of 1 or
  61 tokens align with it, and for those :func:`alignment_problem` says why namespaced requests must bypass
  FlexKV instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

TAG = "flexkv-adapter/1:"  # a new encoding gets a new tag: a new namespace, never a collision with the old one
COMPONENT_LEN = 61
_HEX = COMPONENT_LEN - len(TAG)  # 44 hex digits: 176 bits of SHA-256

Extra = tuple[str | int | None, ...]  # vLLM's and SGLang's shape: ("lora", name, path), ("cache_salt", salt)


def _plain(extra: Extra) -> list[str | int | None]:
    """The tuple as JSON reads it back, or TypeError: a str subclass, a bool or a float could encode ambiguously."""
    if type(extra) is not tuple or not extra or type(extra[0]) is not str:
        raise TypeError(f"a namespace extra is a tuple that starts with its tag, not {extra!r}")
    for item in extra:
        if item is not None and type(item) not in (str, int):
            raise TypeError(f"a namespace extra holds str, int or None, not {type(item).__name__} ({extra!r})")
    return list(extra)


def namespace_of(extras: Sequence[Extra]) -> list[str] | None:
    """FlexKV's ``namespace`` for a request with these tagged extras (in the engine's order); None for none.

    Equal extras give equal namespaces; different ones differ (up to SHA-256) however their strings read."""
    if not extras:
        return None
    encoded = json.dumps([_plain(e) for e in extras], ensure_ascii=True, separators=(",", ":")).encode()
    return [TAG + hashlib.sha256(encoded).hexdigest()[:_HEX]]


def alignment_problem(tokens_per_block: int) -> str | None:
    """Why a namespace cannot be carried at this block size (a plain prompt could reach its KV), or None."""
    if COMPONENT_LEN % tokens_per_block:
        return None
    return (
        f"FlexKV's tokens_per_block={tokens_per_block} divides the namespace's {COMPONENT_LEN} hashed bytes, so a "
        f"plain prompt spelling them would share a namespaced request's block hashes"
    )


__all__ = ["COMPONENT_LEN", "TAG", "Extra", "alignment_problem", "namespace_of"]
