"""What two ways of building a view are compared on: per layer, address, geometry and bytes; or the refusal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flexkv_adapter import AdapterError


def view_facts(view: Any) -> dict[int, tuple[object, ...]]:
    """Per layer id: address, shape, strides, dtype and bytes of the exposed tensor."""
    return {
        layer: (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.contiguous().view(torch.uint8).numpy().tobytes())
        for layer, t in zip(view.layer_ids, view.kv_buffer)
    }


def accepted_or_refused(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "accepted", call()
    except AdapterError as exc:
        return "refused", exc
