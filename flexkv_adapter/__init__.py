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
    from .config.settings import AdapterSettings, load_settings
    from .errors import (
        AdapterError,
        AlignmentError,
        AmbiguousLayoutError,
        FlexKVUnavailableError,
        InconsistentLayersError,
        NotAddressableError,
        PlanError,
        SettingsError,
        UnsupportedFeatureError,
        UnsupportedPoolError,
    )
    from .flexkv.plan import FlexKVPlan, plan
    from .flexkv.register import register
    from .model.axes import Axis
    from .model.report import Report
    from .model.views import MHAView, MLAView, PoolView
    from .pipeline.adapting import adapt
    from .pipeline.align import align_across_ranks, align_block_counts
    from .readers.options import AdaptOptions
    from .readers.recognize import register_attribute_names, unregister_attribute_names

_EXPORTS = {
    "adapt": "pipeline.adapting",
    "align_across_ranks": "pipeline.align",
    "align_block_counts": "pipeline.align",
    "Axis": "model.axes",
    "AdapterError": "errors",
    "AlignmentError": "errors",
    "AmbiguousLayoutError": "errors",
    "FlexKVUnavailableError": "errors",
    "InconsistentLayersError": "errors",
    "NotAddressableError": "errors",
    "PlanError": "errors",
    "SettingsError": "errors",
    "UnsupportedFeatureError": "errors",
    "UnsupportedPoolError": "errors",
    "FlexKVPlan": "flexkv.plan",
    "plan": "flexkv.plan",
    "register": "flexkv.register",
    "AdaptOptions": "readers.options",
    "register_attribute_names": "readers.recognize",
    "unregister_attribute_names": "readers.recognize",
    "Report": "model.report",
    "AdapterSettings": "config.settings",
    "load_settings": "config.settings",
    "MHAView": "model.views",
    "MLAView": "model.views",
    "PoolView": "model.views",
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
    "UnsupportedFeatureError",
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
