"""The one reader of integer metadata, for options and pool attributes alike.

It accepts what ``operator.index`` accepts (``int``, numpy integers, 0-d integer tensors; the ``__index__``
hook is called directly, as operator.index would turn a returned ``True`` into 1) and
refuses bools of every kind (``bool``, ``numpy.bool_``, 0-d bool arrays and tensors: ``True`` is
not a page size), floats, and values whose ``__index__`` raises or that have no value (meta
tensors): each is an :class:`~flexkv_adapter.errors.AdapterError` naming the field, never a raw
exception and never a silently ignored number.
"""

from __future__ import annotations

import numbers
import re

import torch

from ..errors import AdapterError
from ..text import short_repr

LIMIT = 1 << 40  # no real page size, dimension, layer id, block count or byte offset comes near it
_DECIMAL = re.compile(r"[+-]?[0-9]{1,20}")  # ASCII digits only: int() also reads other scripts' digits


def is_bool(value: object) -> bool:
    """A bool of any kind: ``bool``, ``numpy.bool_``, bool arrays and tensors."""
    if isinstance(value, bool):
        return True
    try:
        dtype = getattr(value, "dtype", None)
    except Exception:  # a hostile dtype property: not a bool we can see; operator.index decides
        return False
    return dtype is torch.bool or getattr(dtype, "kind", None) == "b"


def looks_numeric(value: object) -> bool:
    """A number of any kind (so pool metadata of that name must read as an integer), not an unrelated object."""
    kind = type(value)
    return (
        isinstance(value, (numbers.Number, torch.Tensor))
        or hasattr(kind, "__index__")
        or kind.__module__.split(".")[0] == "numpy"
    )


def _index(value: object, what: str, error: type[AdapterError] = AdapterError) -> int | None:
    """The integer, None if ``value`` is not one (bools included); AdapterError if reading it fails."""
    if is_bool(value):
        return None
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise error(f"{what} is a meta tensor ({short_repr(value)}): it has a shape but no value")
        if value.ndim != 0 or value.dtype.is_floating_point or value.dtype.is_complex:
            return None
    hook = getattr(type(value), "__index__", None)  # called directly: operator.index turns a returned True into 1
    if hook is None:
        return None
    try:
        number = hook(value)
    except TypeError:
        return None
    except Exception as exc:  # a raising __index__, a tensor without memory, ...
        raise error(
            f"{what}: reading {short_repr(value)} as an integer raised {type(exc).__name__}: {str(exc)[:120]}"
        ) from None
    # an __index__ that returns True (or an int subclass): a bool is still no integer, and the rest read as int
    return int(number) if isinstance(number, int) and not isinstance(number, bool) else None


def read_integer(value: object, what: str, error: type[AdapterError] = AdapterError) -> int:
    """``value`` as an int with ``operator.index`` semantics; anything else is ``error`` naming ``what``
    (pool metadata: :class:`~flexkv_adapter.errors.InconsistentLayersError`)."""
    number = _index(value, what, error)
    if number is None:
        kind = "an integer, not a bool" if is_bool(value) else "an integer"
        raise error(f"{what} must be {kind}, got {short_repr(value)}")
    return number


def bounded_integer(
    value: object, what: str, minimum: int, maximum: int, error: type[AdapterError] = AdapterError
) -> int:
    """:func:`read_integer`, in ``minimum <= n < maximum``."""
    number = _index(value, what, error)
    if number is None or not minimum <= number < maximum:
        wanted = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")
        bound = f" below {maximum}" if number is not None and number >= maximum else ""
        raise error(f"{what} must be {wanted}{bound}, got {short_repr(value)}")
    return number


def read_integer_list(value: object, what: str, error: type[AdapterError] = AdapterError) -> list[int]:
    """A list, tuple, range or 1-D numpy/torch array of integers, each read by :func:`read_integer`
    (non-negative: these are ids). A set, dict or iterator claims ids too and is refused, never ignored."""
    if _one_d_array(value):
        value = list(value)  # type: ignore[call-overload]
    if not isinstance(value, (list, tuple, range)):
        raise error(f"{what}={short_repr(value)}: expected a list of ids (integers)")
    return [bounded_integer(i, f"{what}[{n}]", 0, LIMIT, error) for n, i in enumerate(value)]


def read_flag(value: object, what: str, error: type[AdapterError] = AdapterError) -> bool:
    """A bool (``bool``, ``numpy.bool_``, 0-d bool array or tensor); 0 and 1 are integers, not flags."""
    if not is_bool(value) or getattr(value, "ndim", 0) != 0:
        raise error(f"{what} must be a bool, got {short_repr(value)}")
    return bool(value)  # type: ignore[arg-type]


def _one_d_array(value: object) -> bool:
    try:
        return (isinstance(value, torch.Tensor) or type(value).__module__ == "numpy") and value.ndim == 1  # type: ignore[attr-defined]
    except Exception:  # a hostile ndim: not an array we can read; refused as not a list
        return False


def decimal_text(text: str) -> int | str:
    """Text that spells an integer (an environment variable: ``"16"``, ``" -3 "``) as that integer; any other
    text unchanged, for the typed rule to refuse (``"16.0"``, ``"1_6"``, ``"0x10"``, ``"true"``, other scripts'
    digits). Text is the only way in whose values are all strings; everywhere else a string is refused."""
    stripped = text.strip()
    return int(stripped) if _DECIMAL.fullmatch(stripped) else text
