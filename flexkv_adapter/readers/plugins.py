"""Third-party recognisers, through the ``flexkv_adapter.recognizers`` entry point group.

An entry point names a callable ``recognise(pool) -> LayoutSpec | dict | path | None``. Plugins
are consulted (in entry point name order) only when the caller gave no ``spec=``, ``attrs=`` or
``axes=``, after hybrid wrappers are unwrapped, and before user-registered and built-in attribute
names. If several plugins answer with different specs, that is an ambiguity error.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

from ..errors import AdapterError, AmbiguousLayoutError
from ..text import clip
from .spec import LayoutSpec, load_spec

logger = logging.getLogger(__name__)
GROUP = "flexkv_adapter.recognizers"


@functools.cache
def recognizers() -> tuple[tuple[str, Callable[[object], Any]], ...]:
    """Loaded plugins, cached; :func:`reload_recognizers` rescans after installing one."""
    loaded = []
    for ep in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            loaded.append((ep.name, ep.load()))
        except Exception as exc:  # a broken plugin must not break adapt() for every pool
            logger.warning("recogniser plugin %s (%s) failed to load: %s", ep.name, ep.value, exc)
    return tuple(loaded)


def reload_recognizers() -> None:
    recognizers.cache_clear()


def plugin_spec(pool: object) -> tuple[str, LayoutSpec] | None:
    """The spec a plugin gives for ``pool`` (and the plugin's name), or None."""
    answers: list[tuple[str, LayoutSpec]] = []
    for name, recognise in recognizers():
        try:
            result = recognise(pool)
        except Exception as exc:
            raise AdapterError(
                f"recogniser plugin {name} failed on {type(pool).__name__}: {type(exc).__name__}: {clip(str(exc))}"
            ) from exc
        if result is None:
            continue
        try:
            answers.append((name, load_spec(result)))
        except AdapterError as exc:
            raise AdapterError(
                f"recogniser plugin {name} returned an invalid spec for {type(pool).__name__}: {exc}"
            ) from None
    distinct = {spec.model_dump_json(exclude={"name", "description"}): (name, spec) for name, spec in answers}
    if len(distinct) > 1:
        listed = "; ".join(f"{name}: {spec.kind} [{spec.axes}] attrs={spec.attrs}" for name, spec in distinct.values())
        raise AmbiguousLayoutError(
            f"recogniser plugins disagree about {type(pool).__name__} ({listed}); pass spec= to choose"
        )
    return answers[0] if answers else None
