"""pydantic's complaints about what a person wrote, as messages that say what to write instead.

One did-you-mean rule for every name a person types: environment variables, settings keys (YAML or
arguments) and layout spec keys. A name is compared with the known ones case-insensitively, ``-``
read as ``_``, by edit distance (a letter inserted, dropped, replaced, or two swapped); the nearest
known names within :func:`reach` are suggested, every one that is equally near, so ``health_post``
gets both ``health_host`` and ``health_port`` rather than a guess. A name further from all of them
gets no suggestion (a wrong hint costs more than none); the message then lists the known keys once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, BeforeValidator
from pydantic_core import ErrorDetails

from ..text import clip
from .strict import number_text

MAX_SUGGESTIONS = 3


def _normal(name: str) -> str:
    return name.lower().replace("-", "_")


def reach(name: str) -> int:
    """The most edits a suggestion may be away: 1 for short names, one more per 5 characters."""
    return 1 + len(name) // 5


def _distance(a: str, b: str, bound: int) -> int:
    """Edits from ``a`` to ``b`` (optimal string alignment), or ``bound + 1`` once it must exceed ``bound``."""
    if abs(len(a) - len(b)) > bound:  # a 200 KB key costs nothing
        return bound + 1
    before: list[int] | None = None
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (ca != cb))
            if before is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > bound:
            return bound + 1
        before, row = row, current
    return min(row[-1], bound + 1)


def close_names(name: str, known: Iterable[str], prefix: str = "") -> list[str]:
    """The known names ``name`` most likely means (nearest first, ties sorted), at most
    :data:`MAX_SUGGESTIONS`; none when every known name is further than :func:`reach`.

    With ``prefix`` (``FLEXKV_ADAPTER_``), only names that start with it compete, compared after it:
    the shared prefix would make every such name look close."""
    typed = _normal(name)
    head = _normal(prefix)
    if not typed.startswith(head):
        return []
    typed = typed[len(head) :]
    bound = reach(typed)
    scored = sorted(
        (_distance(typed, _normal(k)[len(head) :], bound), k) for k in set(known) if _normal(k).startswith(head)
    )
    best = [k for d, k in scored if d <= bound and d == scored[0][0]]
    return best[:MAX_SUGGESTIONS]


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` from :func:`close_names`, or ``""``."""
    found = close_names(name, known, prefix)
    return f" (did you mean {' or '.join(found)}?)" if found else ""


def unknown_key(key: str, known: Collection[str]) -> str:
    """Why an unknown key was refused, with the suggestion if there is one (else :func:`known_keys` lists them)."""
    return f"unknown key{did_you_mean(key, known)}"


def known_keys(errors: Iterable[ErrorDetails], model: type[BaseModel]) -> str:
    """``known keys: ...`` once for a list of errors where an unknown key got no suggestion, else ``""``."""
    known = model.model_fields
    lost = any(e["type"] == "extra_forbidden" and not close_names(str(e["loc"][-1]), known) for e in errors)
    return f"known keys: {', '.join(sorted(known))}" if lost else ""


def _kinds(metadata: Iterable[object]) -> list[str]:
    return [k for m in metadata if isinstance(m, BeforeValidator) and (k := getattr(m.func, "number_kind", None))]


def _number_kind(annotation: object) -> str | None:
    """``"int"`` or ``"float"`` for a type read by one of :mod:`.strict`'s number rules, found in its members
    too (``PositiveInt | None``, ``tuple[Port, Port, Port]``), else None."""
    if get_origin(annotation) is Annotated:
        found = _kinds(annotation.__metadata__)  # type: ignore[attr-defined]
        if found:
            return found[0]
    return next((k for a in get_args(annotation) if (k := _number_kind(a))), None)


def quoted_number(value: object, field: str, model: type[BaseModel]) -> bool:
    """Whether ``value`` is text that spells a number where ``field`` (or its items) wants one, by the
    environment's reading (:func:`.strict.number_text`): in YAML, the quotes around it made it text."""
    info = model.model_fields.get(field)
    if not isinstance(value, str) or info is None:
        return False
    kind = next(iter(_kinds(info.metadata)), None) or _number_kind(info.annotation)
    return kind is not None and not isinstance(number_text(value, kind), str)


def _own_words(err: ErrorDetails) -> str:
    """A validator's own message without pydantic's "Value error, " / "Assertion failed, " in front of it: our
    validators word their problems as the end of "key=value (from origin): ...", a prefix only breaks them."""
    error = (err.get("ctx") or {}).get("error")
    if err["type"] in ("value_error", "assertion_error") and isinstance(error, BaseException) and str(error):
        return str(error)
    return err["msg"]


def problem(err: ErrorDetails, model: type[BaseModel], from_yaml: bool) -> str:
    """The message for one of pydantic's errors on ``model``: an unknown key gets :func:`unknown_key`,
    a quoted number that came from YAML is told to drop the quotes; the rest is pydantic's text."""
    loc = err["loc"]
    key = str(loc[0]) if loc else ""
    if err["type"] == "extra_forbidden" and len(loc) == 1:
        return unknown_key(key, model.model_fields)
    message = clip(_own_words(err), 200)
    value: Any = err.get("input")
    if from_yaml and loc and quoted_number(value, key, model):
        text = clip(value.strip(), 40)
        written = f"{key}: " if len(loc) == 1 else ""
        message += f'; YAML numbers are written unquoted: {written}{text}, not {written}"{text}" (text)'
    return message
