"""Number types for configuration models: a boolean is not a number (``page_size: yes`` is not 1).

Integer fields read their values through :mod:`~flexkv_adapter.config.integers` (the rule adapt()'s options,
plan() and pool metadata use), durations through :func:`read_seconds` (the rule
:func:`~flexkv_adapter.pipeline.align.align_across_ranks` applies to its ``timeout``), so a settings field, a
YAML spec and an argument accept and refuse the same values: ``16.0``, ``"16"``, ``numpy.True_`` and
``10**30`` are no page size anywhere, ``"5"`` and ``True`` no duration. Only the environment holds
text: :class:`EnvNumbers` reads a number's text there first.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BeforeValidator, Field, ValidationInfo
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from ..errors import AdapterError
from ..text import short_repr
from .integers import LIMIT, bounded_integer, decimal_text, is_bool

COLLECTIVE_MAX_S = 7 * 86400.0  # the longest timeout align_across_ranks/align_block_counts (and the setting) take
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?")  # ASCII; no inf, nan or 1_0


def read_seconds(
    value: object, what: str, maximum: float, zero: bool = False, error: type[AdapterError] = AdapterError
) -> float:
    """A duration: a real number (never a bool or a string), finite, in ``(0, maximum]`` (``[0, ...]`` with
    ``zero``); anything else is ``error`` naming ``what``. The settings' :data:`PositiveFloat` with
    ``le=maximum`` accepts the same values (tests/config/test_integer_ways.py)."""
    try:
        number = float(value) if isinstance(value, numbers.Real) and not is_bool(value) else math.nan  # type: ignore[arg-type]
    except (OverflowError, ValueError, TypeError):  # 10**400; a Real whose __float__ fails
        number = math.nan
    if not (number >= 0 if zero else number > 0) or not number <= maximum:  # nan fails both
        low = "[0" if zero else "(0"
        raise error(f"{what}={short_repr(value)} must be a number of seconds in {low}, {maximum:g}]")
    return number


def _marked(check: Callable[..., Any], kind: str) -> BeforeValidator:
    check.number_kind = kind  # type: ignore[attr-defined]  # what the environment's text is read as
    return BeforeValidator(check)


def integer_rule(minimum: int, maximum: int = LIMIT) -> BeforeValidator:
    """The one integer rule as a pydantic validator: ``minimum <= n < maximum``."""

    def read(value: Any, info: ValidationInfo) -> int:
        return bounded_integer(value, info.field_name or "value", minimum, maximum)

    return _marked(read, "int")


def _real(value: Any) -> float:
    """A real number for a float field: never a bool or a string (the range is the field's own)."""
    if is_bool(value):
        raise ValueError("a boolean is not a number")
    if isinstance(value, str) or not isinstance(value, numbers.Real):
        raise ValueError(f"{short_repr(value)} is not a number (only environment text is read as one)")
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        raise ValueError(f"{short_repr(value)} is not a finite number") from None


def number_kind(field: FieldInfo) -> str | None:
    """``"int"`` or ``"float"`` for a field read by one of the rules here (its value or ``None``), else None."""
    members = get_args(field.annotation) if get_origin(field.annotation) in (Union, UnionType) else ()
    metadata = [*field.metadata, *(m for a in members if get_origin(a) is Annotated for m in a.__metadata__)]
    kinds = [getattr(m.func, "number_kind", None) for m in metadata if isinstance(m, BeforeValidator)]
    return next((k for k in kinds if k), None)


def number_text(text: str, kind: str | None) -> object:
    """Environment text as the number it spells (ASCII decimal; a float may have a point and an exponent), or
    the text unchanged for the rule to refuse."""
    if kind == "int":
        return decimal_text(text)
    if kind == "float" and _FLOAT.fullmatch(text.strip()):
        return float(text.strip())
    return text


Real = _marked(_real, "float")
Int = Annotated[int, integer_rule(-LIMIT)]
PositiveInt = Annotated[int, integer_rule(1)]
NonNegativeInt = Annotated[int, integer_rule(0)]
PositiveFloat = Annotated[float, Real, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Real, Field(ge=0, allow_inf_nan=False)]


class EnvNumbers(PydanticBaseSettingsSource):
    """The environment, with number fields' text read as numbers: the environment holds only text, and
    every other way in refuses a string where a number belongs (``"16"`` is an integer only here)."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._env = env

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._env.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        fields = self.settings_cls.model_fields
        return {
            k: number_text(v, number_kind(fields[k])) if isinstance(v, str) and k in fields else v
            for k, v in self._env().items()
        }
