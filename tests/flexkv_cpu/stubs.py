"""Modules FlexKV imports that do not exist on CPU (``flexkv.c_ext``, ``nvtx``): any name is a do-nothing class."""

from __future__ import annotations

import types
from typing import Any


class AnyNameModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})
