"""Global layer ids of the exposed layers: from ``layer_ids=``, a dict's names, ``model_layer_ids``, or ``start_layer``.

Each source that is present must agree with the others; a contradiction is an error, never a silent choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from . import hybrid
from .containers import Container, Located
from .errors import AdapterError, AmbiguousLayoutError, InconsistentLayersError
from .layout import Geometry
from .probe import probe, probe_path
from .views import PoolView


def layer_ids_of(pool: object, located: Located, count: int, geometry: Geometry) -> list[int]:
    """Global layer ids, in the order of the views.

    A dict's ``layer_ids=`` are given in the dict's order; when its names give ids too, the two
    must agree. ``start_layer`` does not apply to a dict (its names, or ``layer_ids=``, give ids).
    """
    # the ids in names, from K or V (pairing_problem made sure that both give the same, or one none)
    container: Container = next((c for c in located.containers if c.layer_ids), located.containers[0])
    name = type(pool).__name__
    if container.keyed and "start_layer" in geometry.given:
        raise AdapterError(
            f"{name}: start_layer= does not apply to a dict of layers: the names give the ids"
            f"{f' {list(container.layer_ids)}' if container.layer_ids else ''}; pass layer_ids=[...] "
            f"in the dict's order instead"
        )
    given = geometry.layer_ids
    if given is not None and len(given) != count:
        raise AdapterError(f"layer_ids has {len(given)} entries but the pool has {count} layers")
    if given is not None and container.dict_order is not None:
        given = tuple(given[i] for i in container.dict_order)  # the dict's order -> the views' order
        if container.layer_ids is not None and given != container.layer_ids:
            raise InconsistentLayersError(
                f"{name}: layer_ids={list(geometry.layer_ids or ())} (in the dict's order) contradicts the layer "
                f"indices in the names ({list(container.layer_ids)} in index order); drop layer_ids or fix the names"
            )
    model_ids = _model_layer_ids(attrs_owner(pool, geometry.attrs), count)
    if given is not None:
        _agree(name, f"layer_ids={list(given)}", list(given), model_ids)
        return list(given)
    if container.ids_problem:
        raise AmbiguousLayoutError(f"{name}: {container.ids_problem}")
    if container.layer_ids is not None:
        return list(container.layer_ids)
    if model_ids is not None:
        if "start_layer" in geometry.given:
            start = geometry.start_layer
            _agree(name, f"start_layer={start}", list(range(start, start + count)), model_ids)
        return model_ids
    return list(range(geometry.start_layer, geometry.start_layer + count))


def attrs_owner(pool: object, attrs: tuple[str, ...] | None) -> object:
    """The object holding the named attributes: ``pool.full_kv_pool`` for ``attrs=["full_kv_pool.k_buffer", ...]``."""
    owners = {a.rpartition(".")[0] for a in attrs or ()}
    owner = owners.pop() if len(owners) == 1 else ""
    return probe_path(pool, owner) if owner else pool


def _model_layer_ids(pool: object, count: int) -> list[int] | None:
    """SGLang's ``model_layer_ids``: the global ids of this pool's layers, if it has them."""
    model_ids = probe(pool, "model_layer_ids")
    if not isinstance(model_ids, (list, tuple, range)):
        return None
    ids = list(model_ids)
    valid = all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    if not valid or len(ids) != count or len(set(ids)) != count:
        raise InconsistentLayersError(
            f"{type(pool).__name__}.model_layer_ids={model_ids!r:.200}: expected {count} distinct layer ids "
            f"(integers), one per layer"
        )
    return ids


def _agree(name: str, option: str, ids: list[int], model_ids: list[int] | None) -> None:
    if model_ids is not None and ids != model_ids:
        raise InconsistentLayersError(
            f"{name}: option {option} gives layers {ids} but {name}.model_layer_ids is {model_ids}; "
            f"drop the option or fix the pool"
        )


def mapped_layer_ids(pool: object, structure: hybrid.HybridStructure, view: PoolView, options: set[str]) -> PoolView:
    """The view labelled with the wrapper's layer mapping (view and report alike).

    ``layer_ids=``/``start_layer=`` or the sub-pool's own ``model_layer_ids`` must agree with it.
    """
    if structure.layer_ids is None:
        return view
    mapped, name = list(structure.layer_ids), type(pool).__name__
    if len(mapped) != len(view.layer_ids):
        raise InconsistentLayersError(
            f"{name}: its layer mapping names {len(mapped)} attention layers "
            f"{mapped} but {structure.primary_attr} holds {len(view.layer_ids)}"
        )
    explicit = sorted({"layer_ids", "start_layer"} & options)
    if probe(structure.primary, "model_layer_ids") is not None:
        explicit.append(f"{structure.primary_attr}.model_layer_ids")
    if explicit and view.layer_ids != mapped:
        raise InconsistentLayersError(
            f"{name}: {', '.join(explicit)} give layers {view.layer_ids} but the wrapper's layer mapping puts "
            f"{structure.primary_attr}'s layers at {mapped}; drop the option or fix the mapping"
        )
    return view.rebuild(layer_ids=mapped, report=replace(view.report, layer_ids=tuple(mapped)))


def named_sub_pool_ids(pool: object, attrs: Sequence[str], view: PoolView, options: set[str]) -> PoolView:
    """Explicit attrs into one sub-pool of a hybrid wrapper: its layers' ids come from the wrapper's mapping."""
    owners = {a.rpartition(".")[0] for a in attrs}
    owner = owners.pop() if len(owners) == 1 else ""
    structure = hybrid.detect(pool) if owner in ("full_kv_pool", "swa_kv_pool", "main_pool") else None
    ids = tuple(g for g, attr, _ in structure.backing if attr == owner) if structure else ()
    if structure is None or not ids:
        return view
    sub = replace(structure, primary_attr=owner, primary=probe(pool, owner), layer_ids=ids)
    return mapped_layer_ids(pool, sub, view, options)
