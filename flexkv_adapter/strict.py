"""Number types for configuration models: a boolean is not a number (``page_size: yes`` is not 1)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


NoBool = BeforeValidator(_refuse_bool)
Int = Annotated[int, NoBool]
PositiveInt = Annotated[int, NoBool, Field(gt=0)]
NonNegativeInt = Annotated[int, NoBool, Field(ge=0)]
PositiveFloat = Annotated[float, NoBool, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, NoBool, Field(ge=0, allow_inf_nan=False)]
