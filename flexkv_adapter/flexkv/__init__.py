"""The FlexKV-facing layer: layout/registration plans and registration.

This is the only part of the package that imports FlexKV, and it does so lazily: planning works
without FlexKV; building FlexKV's own ``KVCacheLayout`` or registering needs it.
"""

from ._import import import_flexkv
from .model import check_against_model_config, check_for_flexkv_connector
from .plan import AddressingMode, FlexKVPlan, LayoutType, plan
from .register import register

__all__ = [
    "AddressingMode",
    "FlexKVPlan",
    "LayoutType",
    "check_against_model_config",
    "check_for_flexkv_connector",
    "import_flexkv",
    "plan",
    "register",
]
