"""flexkv_adapter: zero-copy, FlexKV-ready views of any KV-cache pool.

Wrap a pool before constructing FlexKV's connector::

    from flexkv_adapter import adapt
    connector = FlexKVConnector(kvcache=adapt(pool), ...)
"""

from .adapt import adapt
from .axes import Axis
from .errors import (
    AdapterError,
    AmbiguousLayoutError,
    InconsistentLayersError,
    NotAddressableError,
    UnsupportedPoolError,
)
from .options import AdaptOptions
from .recognize import register_attribute_names, unregister_attribute_names
from .report import Report
from .views import MHAView, MLAView, PoolView

__all__ = [
    "AdaptOptions",
    "AdapterError",
    "AmbiguousLayoutError",
    "Axis",
    "InconsistentLayersError",
    "MHAView",
    "MLAView",
    "NotAddressableError",
    "PoolView",
    "Report",
    "UnsupportedPoolError",
    "adapt",
    "register_attribute_names",
    "unregister_attribute_names",
]
__version__ = "0.1.0"
