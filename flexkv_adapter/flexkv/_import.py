"""The one place that imports FlexKV, lazily: planning never needs it, registration does."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import FLEXKV_INSTALL_HINT, FlexKVUnavailableError


def import_flexkv(module: str) -> ModuleType:
    """Import a FlexKV module, or raise :class:`FlexKVUnavailableError` with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FlexKVUnavailableError(f"cannot import {module} ({exc}). {FLEXKV_INSTALL_HINT}") from exc
    except OSError as exc:  # flexkv.common.memory_handle loads libcudart at import time
        raise FlexKVUnavailableError(f"{module} failed to load a native library ({exc}); it needs CUDA") from exc
