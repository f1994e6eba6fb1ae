"""flexkv_adapter: zero-copy, FlexKV-ready views of any KV-cache pool.

Wrap a pool before constructing FlexKV's connector::

    from flexkv_adapter import adapt
    connector = FlexKVConnector(kvcache=adapt(pool), ...)

Names are imported lazily, so tools that need no tensors (``start-remote``, settings) start
without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapting import adapt
    from .align import align_across_ranks, align_block_counts
    from .axes import Axis
    from .errors import (
        AdapterError,
        AlignmentError,
        AmbiguousLayoutError,
        FlexKVUnavailableError,
        InconsistentLayersError,
        NotAddressableError,
        PlanError,
        SettingsError,
        UnsupportedPoolError,
    )
    from .flexkv.plan import FlexKVPlan, plan
    from .flexkv.register import register
    from .options import AdaptOptions
    from .recognize import register_attribute_names, unregister_attribute_names
    from .report import Report
    from .settings import AdapterSettings, load_settings
    from .views import MHAView, MLAView, PoolView

_EXPORTS = {
    "adapt": "adapting",
    "align_across_ranks": "align",
    "align_block_counts": "align",
    "Axis": "axes",
    "AdapterError": "errors",
    "AlignmentError": "errors",
    "AmbiguousLayoutError": "errors",
    "FlexKVUnavailableError": "errors",
    "InconsistentLayersError": "errors",
    "NotAddressableError": "errors",
    "PlanError": "errors",
    "SettingsError": "errors",
    "UnsupportedPoolError": "errors",
    "FlexKVPlan": "flexkv.plan",
    "plan": "flexkv.plan",
    "register": "flexkv.register",
    "AdaptOptions": "options",
    "register_attribute_names": "recognize",
    "unregister_attribute_names": "recognize",
    "Report": "report",
    "AdapterSettings": "settings",
    "load_settings": "settings",
    "MHAView": "views",
    "MLAView": "views",
    "PoolView": "views",
}
__all__ = [
    "AdaptOptions",
    "AdapterError",
    "AdapterSettings",
    "AlignmentError",
    "AmbiguousLayoutError",
    "Axis",
    "FlexKVPlan",
    "FlexKVUnavailableError",
    "InconsistentLayersError",
    "MHAView",
    "MLAView",
    "NotAddressableError",
    "PlanError",
    "PoolView",
    "Report",
    "SettingsError",
    "UnsupportedPoolError",
    "adapt",
    "align_across_ranks",
    "align_block_counts",
    "load_settings",
    "plan",
    "register",
    "register_attribute_names",
    "unregister_attribute_names",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazily imported names too: ``dir(flexkv_adapter)`` lists the whole public API."""
    return sorted({*globals(), *__all__})
