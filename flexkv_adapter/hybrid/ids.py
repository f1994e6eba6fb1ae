"""A hybrid wrapper's layer metadata (``layers_mapping``, id mappings, ``model_layer_ids``), read once.

Every id goes through the one integer rule (:mod:`.integers`): Python, numpy and 0-d tensor integers
read alike; bools, floats and negatives are malformed metadata. Two entries that read as the same id
(``1`` and ``torch.tensor(1)`` are different dict keys) would label two layers alike, so they are
refused too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..config.integers import LIMIT, bounded_integer, read_flag, read_integer_list
from ..errors import AdapterError, InconsistentLayersError
from ..readers.probe import probe
from ..text import short_repr


def bad_metadata(owner: object, attr: str, value: object, expected: str) -> InconsistentLayersError:
    return InconsistentLayersError(
        f"{type(owner).__name__}.{attr} = {short_repr(value)}: expected {expected}; the hybrid wrapper's "
        f"layer metadata is malformed, so which layers hold what cannot be trusted"
    )


def _id(value: object, where: str) -> int:
    return bounded_integer(value, where, 0, LIMIT, InconsistentLayersError)


def _distinct(owner: object, attr: str, mapping: object, ids: list[int]) -> None:
    if len(set(ids)) != len(ids):
        raise bad_metadata(owner, attr, mapping, "each layer id once (two keys read as the same integer)")


def _enumerates(indices: Iterable[int]) -> bool:
    """The sub-pool indices are 0..n-1, each once: otherwise a layer would be labelled with another's id."""
    ordered = sorted(indices)
    return ordered == list(range(len(ordered)))


def id_map(owner: object, attr: str) -> Mapping[object, object] | None:
    """The wrapper's id mapping ``attr``, None if absent. One that is present but no mapping (a list of
    pairs, a string) is malformed metadata, never skipped in favour of labels 0..n-1; so is one with two
    readings (SGLang looks layers up with ``[]``, this module reads ``items()``): see :func:`_one_reading`."""
    value = probe(owner, attr)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_metadata(owner, attr, value, "a dict of global layer id -> index in its sub-pool")
    _one_reading(owner, attr, value)
    return value


def _one_reading(owner: object, attr: str, mapping: Mapping[object, object]) -> None:
    """items(), iteration with ``[]``, and a second read of the attribute give the same objects in order."""
    try:
        items = list(mapping.items())
        looked_up = [(k, mapping[k]) for k in mapping]
        again = probe(owner, attr)
        again_items = list(again.items()) if isinstance(again, Mapping) else []
    except AdapterError:
        raise
    except Exception as exc:  # a raising __iter__/__getitem__/items
        raise bad_metadata(owner, attr, mapping, f"a mapping that reads without error ({type(exc).__name__})") from None
    for other in (looked_up, again_items):
        if len(other) != len(items) or any(a is not c or b is not d for (a, b), (c, d) in zip(items, other)):
            raise bad_metadata(
                owner,
                attr,
                mapping,
                "one reading: the same entries through items(), through iteration and [] (SGLang's lookup), and "
                "on every read of the attribute",
            )


def inverse(owner: object, attr: str, mapping: Mapping[object, object]) -> tuple[int, ...]:
    """Global layer ids in sub-pool order, from ``{global id: index in the sub-pool}``."""
    where = f"{type(owner).__name__}.{attr}"
    items = [(_id(i, f"{where}[{short_repr(g)}]"), _id(g, f"{where} key")) for g, i in mapping.items()]
    _distinct(owner, attr, mapping, [g for _, g in items])
    if not _enumerates(i for i, _ in items):
        expected = "a dict of global layer id -> index in the sub-pool (each index 0..n-1 once)"
        raise bad_metadata(owner, attr, mapping, expected)
    return tuple(g for _, g in sorted(items))


def swa_ids(pool: object, mapping: Mapping[object, object]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full-attention ids, SWA ids), each in sub-pool order, from ``{id: (index, is_swa)}``."""
    where = f"{type(pool).__name__}.layers_mapping"
    entries = []
    for g, value in mapping.items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise bad_metadata(pool, "layers_mapping", mapping, "a dict of layer id -> (index in its sub-pool, is_swa)")
        entry = f"{where}[{short_repr(g)}]"
        index, swa = _id(value[0], entry), read_flag(value[1], f"{entry} is_swa", InconsistentLayersError)
        entries.append((index, _id(g, f"{where} key"), swa))
    _distinct(pool, "layers_mapping", mapping, [g for _, g, _ in entries])
    entries.sort()
    for swa in (False, True):
        if not _enumerates(i for i, _, s in entries if s is swa):
            raise bad_metadata(pool, "layers_mapping", mapping, "each sub-pool's indices 0..n-1, once each")
    return tuple(g for _, g, swa in entries if not swa), tuple(g for _, g, swa in entries if swa)


def listed_ids(sub: object, attr: str = "model_layer_ids") -> tuple[int, ...]:
    """A sub-pool's own list of layer ids (``model_layer_ids``, ``mamba_layer_ids``); () if it has none."""
    ids = probe(sub, attr)
    if ids is None:
        return ()
    read = read_integer_list(ids, f"{type(sub).__name__}.{attr}", InconsistentLayersError)
    _distinct(sub, attr, ids, read)
    return tuple(read)


__all__ = ["bad_metadata", "id_map", "inverse", "listed_ids", "swa_ids"]
