"""``vllm._custom_ops.rotary_embedding`` for SGLang's CPU engine: imported, never to be called (see __init__)."""

from __future__ import annotations

from typing import Any


class NotVLLMError(RuntimeError):
    """SGLang called vLLM's rotary kernel: the torch-native CPU path was expected to."""


def rotary_embedding(*args: Any, **kwargs: Any) -> None:
    raise NotVLLMError(
        "vllm._custom_ops.rotary_embedding was called: this is tests/e2e/sglang_standins, not vLLM; "
        "SGLang's CPU path was expected to use its torch-native rotary embedding"
    )
