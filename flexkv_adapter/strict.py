"""Number types for configuration models: a boolean is not a number (``page_size: yes`` is not 1).

Integer fields read their values through :mod:`~flexkv_adapter.integers` (the rule adapt()'s options,
plan() and pool metadata use), so a settings field, a YAML spec and an argument accept and refuse the
same values: ``16.0``, ``"16"``, ``numpy.True_`` and ``10**30`` are refused everywhere, numpy and 0-d
tensor integers accepted everywhere. Environment text is turned into integers before, by
:func:`~flexkv_adapter.integers.decimal_text`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BeforeValidator, Field, ValidationInfo
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from .integers import LIMIT, bounded_integer, decimal_text


def _refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


def integer_rule(minimum: int, maximum: int = LIMIT) -> BeforeValidator:
    """The one integer rule as a pydantic validator: ``minimum <= n < maximum``."""

    def read(value: Any, info: ValidationInfo) -> int:
        return bounded_integer(value, info.field_name or "value", minimum, maximum)

    check: Callable[..., int] = read
    check.integer_rule = (minimum, maximum)  # type: ignore[attr-defined]  # marks integer fields (env text)
    return BeforeValidator(check)


def is_integer_field(field: FieldInfo) -> bool:
    """Whether a field's value (or ``None``) is read by :func:`integer_rule`."""
    members = get_args(field.annotation) if get_origin(field.annotation) in (Union, UnionType) else ()
    metadata = [*field.metadata, *(m for a in members if get_origin(a) is Annotated for m in a.__metadata__)]
    return any(isinstance(m, BeforeValidator) and hasattr(m.func, "integer_rule") for m in metadata)


NoBool = BeforeValidator(_refuse_bool)
Int = Annotated[int, integer_rule(-LIMIT)]
PositiveInt = Annotated[int, integer_rule(1)]
NonNegativeInt = Annotated[int, integer_rule(0)]
PositiveFloat = Annotated[float, NoBool, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, NoBool, Field(ge=0, allow_inf_nan=False)]


class EnvIntegers(PydanticBaseSettingsSource):
    """The environment, with integer fields' text read as decimal integers: the environment holds only text,
    and every other way in refuses a string where a number belongs (``"16"`` is an integer only here)."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._env = env

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._env.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        data = self._env()
        fields = self.settings_cls.model_fields
        return {
            k: decimal_text(v) if isinstance(v, str) and k in fields and is_integer_field(fields[k]) else v
            for k, v in data.items()
        }
