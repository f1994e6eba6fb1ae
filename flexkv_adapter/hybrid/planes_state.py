"""Everything a pool owner holds in tensors, so a pool offloaded whole leaves nothing out unnamed.

State is found wherever Python keeps it: instance attributes, ``__slots__``, and inside dict attributes
(an ``nn.Module``'s ``_buffers`` and ``_parameters`` among them). A tensor whose bytes the registration
does not cover would be lost on a prefix hit, so it is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from ..errors import UnsupportedPoolError
from ..readers.probe import probe


class PartialPoolError(UnsupportedPoolError):
    """Part of the pool cannot be registered with the KV's page ids: FlexKV could store only the rest."""


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a tensor reaches: a tensor starting where the KV does may hold more than it."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _inside(span: tuple[int, int], covered: list[tuple[int, int]]) -> bool:
    return any(a <= span[0] and span[1] <= b for a, b in covered)


def _slots(owner: object) -> Iterator[str]:
    for cls in type(owner).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        yield from ([slots] if isinstance(slots, str) else slots)


def _values(owner: object) -> Iterator[tuple[str, object]]:
    """(name, value) of every attribute an owner keeps: its ``__dict__`` and its ``__slots__``."""
    found = probe(owner, "__dict__", tolerate=True)
    if isinstance(found, dict):
        yield from list(found.items())
    for name in _slots(owner):
        if name not in ("__dict__", "__weakref__"):
            yield name, probe(owner, name, tolerate=True)


def _tensors_in(name: str, value: object) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors a value holds: itself, a list/tuple of them, or the values of a dict (one level)."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        yield from ((name, t) for t in value if isinstance(t, torch.Tensor))
    elif isinstance(value, Mapping):
        try:
            items = list(value.items())
        except Exception:  # a mapping that cannot be listed holds nothing we could account for
            return
        for key, item in items:
            key_name = key if isinstance(key, str) else repr(key)[:40]
            for _, t in _tensors_in(key_name, item):
                yield (f"{name}[{key_name!r}]", t)


def check_accounted(owners: Sequence[object], registered: Sequence[torch.Tensor], known: frozenset[str]) -> None:
    """Refuse a tensor an owner holds whose bytes ``registered`` does not cover: it would be lost on a prefix hit.
    Attributes named in ``known`` (the KV planes, derived pointer tables, layer ids) are not state."""
    covered = _merged([_span(t) for t in registered])
    unknown = []
    for owner in owners:
        if owner is None:
            continue
        for attr, value in _values(owner):
            if attr in known:
                continue
            lost = [n for n, t in _tensors_in(attr, value) if _real(t) and not _inside(_span(t), covered)]
            lost = [n for n in lost if n.partition("[")[2].strip("'\"]") not in known]
            if lost:
                unknown.append(f"{type(owner).__name__}.{lost[0]}")
    if unknown:
        raise PartialPoolError(
            f"{unknown} hold state this adapter does not know how to offload with the KV's pages; offloading "
            f"the rest would restore prefixes without it. Report the pool layout, or serve without FlexKV"
        )


def _real(t: torch.Tensor) -> bool:
    try:
        return bool(t.numel()) and not t.is_meta
    except Exception:
        return False


__all__ = ["PartialPoolError", "check_accounted"]
