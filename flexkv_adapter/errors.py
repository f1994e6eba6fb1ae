"""The library's error hierarchy.

Every error is an :class:`AdapterError`, itself a :class:`ValueError`, so callers that already
guard pool set-up with ``except ValueError`` keep working. Messages carry the geometry involved
(pool class, attribute, shape, stride, dtype) and the fix, because a KV layout error is usually
diagnosed from one log line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


FLEXKV_INSTALL_HINT = (
    "FlexKV is not on the package registries: build it from source (git clone "
    "taco-project/FlexKV && pip install -e .) on a machine with CUDA, then retry"
)


MESSAGE_LIMIT = 8000  # characters; the longest real message (every recogniser's reason) is well under it


class AdapterError(ValueError):
    """Base class of every error raised by flexkv_adapter.

    Its message is bounded here, once for every path: a message embeds names from user input and hostile
    objects (a class, an attrs= path, an option name of 100,000 characters); the middle goes, the fix stays.
    """

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and len(args[0]) > MESSAGE_LIMIT:
            text, keep = args[0], MESSAGE_LIMIT // 2
            args = (f"{text[:keep]} ...[{len(text) - 2 * keep} characters left out]... {text[-keep:]}",)
        super().__init__(*args)


class UnsupportedPoolError(AdapterError):
    """No recogniser understood the pool (the message lists why each one declined)."""


class UnsupportedFeatureError(UnsupportedPoolError):
    """An engine feature (a pool class, a KV cache spec type, an option) that its engine's feature table refuses
    or does not name (default deny); the message names the feature and the table (docs/sglang.md, docs/vllm.md)."""


class AmbiguousLayoutError(AdapterError):
    """More than one reading of the tensor axes fits; an option must settle which."""


class NotAddressableError(AdapterError):
    """A view exists but FlexKV, which ignores strides, would read the wrong bytes."""


class InconsistentLayersError(AdapterError):
    """Layers (or K and V) disagree in shape, dtype or device, or geometry conflicts."""


class PlanError(AdapterError):
    """The FlexKV layout cannot be planned: inconsistent TP/head settings or a misread addressing mode."""


class AlignmentError(AdapterError):
    """Ranks disagree on the layout, or a rank did not join a cross-rank alignment in time."""


class FlexKVUnavailableError(AdapterError):
    """FlexKV (an optional dependency) is not importable."""


class SettingsError(AdapterError):
    """Invalid configuration: the key, the value, and what was expected."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


def describe(tensor: torch.Tensor) -> str:
    """One-line geometry of a tensor for error messages."""
    return (
        f"shape={tuple(tensor.shape)} stride={tuple(tensor.stride())} "
        f"dtype={tensor.dtype} offset={tensor.storage_offset()} device={tensor.device}"
    )
