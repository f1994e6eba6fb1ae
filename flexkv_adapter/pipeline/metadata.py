"""What the pool's own metadata says: its geometry, merged with the options, and its layers' global ids.

Every fact is read from the objects that own the tensors (:func:`~flexkv_adapter.readers.containers.attr_owners`:
the pool, or the sub-objects ``attrs=`` reach into) through the one integer reader. An option, a dict's names,
``model_layer_ids`` or a hybrid wrapper's mapping that contradicts another source is an error, never a silent
choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from ..config.integers import LIMIT, read_integer_list
from ..errors import AdapterError, AmbiguousLayoutError, InconsistentLayersError, NotAddressableError
from ..model.axes import Axis, parse_axes
from ..model.hybrid import HybridStructure
from ..model.layout import Geometry
from ..model.views import PoolView
from ..readers.containers import Container, Located, attr_owners, layer_index_from_name, probe, probe_int
from ..readers.sources import check_wrapper_page_size
from ..readers.wrappers import detect
from ..text import short_repr

_POOL_INTS = ("layer_num", "head_num", "head_dim", "v_head_dim", "page_size", "start_layer")
_POOL_MINIMUM = {"page_size": 1, "start_layer": 0}  # pool metadata that is used, not only matched


def _pool_kv_dim(pool: object, prefix: str) -> tuple[int | None, str]:
    if (dim := probe_int(pool, "kv_cache_dim")) is not None:
        return dim, f"{prefix}kv_cache_dim"
    rank, rope = probe_int(pool, "kv_lora_rank"), probe_int(pool, "qk_rope_head_dim")
    if rank is not None and rope is not None:
        return rank + rope, f"{prefix}kv_lora_rank + {prefix}qk_rope_head_dim"
    return None, ""


def _owner_facts(owner: object, prefix: str, logical: object) -> dict[str, tuple[int | None, str]]:
    """One metadata owner's integer facts, each with where it came from."""
    facts = {n: (probe_int(owner, n), f"{prefix}{n}") for n in _POOL_INTS}
    facts["kv_dim"] = _pool_kv_dim(owner, prefix)
    if isinstance(logical, torch.dtype) and str(logical).endswith("_x2"):
        # Packed dtypes (FP4 as float4_e2m1fn_x2) store two values per element: the buffers'
        # last dim is half the pool's head dims.
        for name in ("head_dim", "v_head_dim", "kv_dim"):
            value, origin = facts[name]
            if value is not None:
                facts[name] = (value // 2, f"{origin} / 2 ({logical} packs two values per element)")
    return facts


def _prefix(path: str) -> str:
    return f"pool.{path}." if path else "pool."


def owners_fact(pool: object, owners: list[tuple[str, object]], name: str) -> tuple[object, str]:
    """A descriptive attribute (``dtype``, ``store_dtype``, ``kv_cache_layout``) of every attrs= owner, and where
    it was read: owners that disagree are an error, never one of them chosen silently. A tensor's own dtype
    describes nothing."""
    found = [
        (v, f"{_prefix(p)}{name}")
        for p, o in owners
        if not isinstance(o, torch.Tensor) and (v := probe(o, name)) is not None
    ]
    for value, origin in found[1:]:
        try:
            differ = bool(value != found[0][0])
        except Exception:  # values that cannot even be compared (tensors of several elements) do not agree
            differ = True
        if differ:
            raise InconsistentLayersError(
                f"{type(pool).__name__}: {found[0][1]}={short_repr(found[0][0])} but {origin}={short_repr(value)}; "
                f"the attributes named by attrs= belong to pools that disagree"
            )
    return found[0] if found else (None, f"pool.{name}")


def _merged_facts(pool: object, owners: list[tuple[str, object]]) -> dict[str, tuple[int, str]]:
    """The facts of every owner of the named attributes; two owners that disagree are an error."""
    merged: dict[str, tuple[int, str]] = {}
    for path, owner in owners:
        logical = None if isinstance(owner, torch.Tensor) else probe(owner, "dtype")
        for name, (value, origin) in _owner_facts(owner, _prefix(path), logical).items():
            if value is None:
                continue
            if name in merged and merged[name][0] != value:
                raise InconsistentLayersError(
                    f"{type(pool).__name__}: {merged[name][1]}={merged[name][0]} but {origin}={value}; the "
                    f"attributes named by attrs= belong to pools that disagree"
                )
            merged.setdefault(name, (value, origin))
    return merged


def resolve_geometry(pool: object, page_size: int | None, options: Mapping[str, Any]) -> Geometry:
    """Merge options with the pool's metadata; an option that contradicts the pool is an error.

    ``options`` and ``page_size`` are checked already (:func:`~flexkv_adapter.readers.options.validate_options`:
    the caller's by adapt() and plan(), a spec's or plugin's by
    :func:`~flexkv_adapter.readers.sources.locate_source`), so every value here has its checked form.
    """
    given = {**options, **({"page_size": page_size} if page_size is not None else {})}
    facts: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    owners = attr_owners(pool, given.get("attrs"))  # attrs= owners' metadata is read like a top-level pool's
    for name, (value, origin) in _merged_facts(pool, owners).items():
        if value < _POOL_MINIMUM.get(name, value) or value >= LIMIT:  # 0 divides by zero, a negative trims up
            raise InconsistentLayersError(
                f"{type(pool).__name__}: {origin}={value} is out of range (must be >= {_POOL_MINIMUM.get(name, 0)} "
                f"and below 2**40); fix the pool metadata"
            )
        if name in given and given[name] != value:
            raise InconsistentLayersError(
                f"{type(pool).__name__}: option {name}={given[name]!r} contradicts {origin}={value}; "
                f"drop the option or fix the pool metadata"
            )
        facts[name] = value
        sources.append((name, origin))
    (logical, where), (stored, _) = owners_fact(pool, owners, "dtype"), owners_fact(pool, owners, "store_dtype")
    if isinstance(logical, torch.dtype) and given.get("dtype", logical) not in (logical, stored):
        raise InconsistentLayersError(
            f"{type(pool).__name__}: option dtype={given['dtype']} contradicts {where}={logical}"
            f"{f' (store_dtype={stored})' if isinstance(stored, torch.dtype) else ''}; drop the option or fix the pool"
        )
    facts.update(given)
    kind = facts.get("kind")
    axes: tuple[Axis, ...] | None = given.get("axes")
    layout, origin = owners_fact(pool, owners, "kv_cache_layout")  # SGLang MHA pools: "nhd" | "hnd" | "vectorized_5d"
    layout = str.__str__(layout) if isinstance(layout, str) else layout  # a str subclass's == may lie
    known = isinstance(layout, str) and layout in ("nhd", "hnd", "vectorized_5d")
    if axes is None and layout is not None and not known:  # axes= names the layout instead
        raise NotAddressableError(
            f"{type(pool).__name__}: {origin}={short_repr(layout)} is not a layout adapt() reads ('nhd', 'hnd'; "
            f"SGLang's ROCm 'vectorized_5d' is refused by name); name the tensors' axes with axes=..."
        )
    if axes is None and layout == "hnd":
        axes, kind = parse_axes("P H T D"), kind or "mha"
    elif axes is None and layout == "vectorized_5d":
        raise NotAddressableError(
            f"{type(pool).__name__}: kv_cache_layout='vectorized_5d' (ROCm AITER) packs K as "
            f"[blocks, heads, dim/X, page, X]; no per-layer [rows, heads, dim] view exists. Fix: run the engine "
            f"with the NHD layout (unset SGLANG_AITER_KV_CACHE_LAYOUT)"
        )
    return Geometry(
        layer_num=facts.get("layer_num"),
        head_num=facts.get("head_num"),
        head_dim=facts.get("head_dim"),
        v_head_dim=facts.get("v_head_dim"),
        kv_dim=facts.get("kv_dim"),
        page_size=facts.get("page_size"),
        start_layer=facts.get("start_layer", 0),
        kind=kind,
        axes=axes,
        attrs=tuple(given["attrs"]) if "attrs" in given else None,
        layer_ids=tuple(given["layer_ids"]) if "layer_ids" in given else None,
        dtype=given.get("dtype"),
        sources=tuple(sources),
        given=frozenset(given),
    )


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
        if container.layer_ids is None and container.names is not None:  # partly named: those names must agree
            names_layer_ids(container.names, given, name)
    model_ids = owners_model_ids(pool, geometry.attrs, count)
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


def names_layer_ids(names: Sequence[object], given: Sequence[int] | None, where: str) -> list[int]:
    """Layer ids of a dict's entries in the dict's order: from ``layer_ids=`` or the names, which must agree.

    An entry whose name holds no layer index (``mtp.attn``) is never labelled by its position: without
    ``layer_ids=`` that is an AmbiguousLayoutError, as for any other dict.
    """
    parsed = [layer_index_from_name(n) for n in names]
    if given is not None:
        if len(given) != len(names):
            raise AdapterError(f"{where}: layer_ids has {len(given)} entries but the dict has {len(names)} layers")
        if clash := [(n, p, g) for n, p, g in zip(names, parsed, given) if p is not None and p != g]:
            name, index, wanted = clash[0]
            raise InconsistentLayersError(
                f"{where}: layer_ids={short_repr(list(given))} (in the dict's order) contradicts the names: "
                f"{short_repr(name)} holds layer {index}, not {wanted}; drop layer_ids or fix the names"
            )
        return list(given)
    if any(p is None for p in parsed) or len(set(parsed)) != len(parsed):
        unnamed = [short_repr(n) for n, p in zip(names, parsed) if p is None][:3]
        raise AmbiguousLayoutError(
            f"{where}: cannot take one distinct layer index from each name ({', '.join(unnamed) or 'repeated'}"
            f"{' hold none' if unnamed else ''}); pass layer_ids=[...] in the dict's order"
        )
    return parsed  # type: ignore[return-value]


def owners_model_ids(pool: object, attrs: tuple[str, ...] | None, count: int) -> list[int] | None:
    """``model_layer_ids`` of the object(s) holding the named tensors
    (:func:`~flexkv_adapter.readers.containers.attr_owners`, the one owner rule metadata is read by too); two
    owners that disagree are an error."""
    found = [(p, ids) for p, owner in attr_owners(pool, attrs) if (ids := _model_layer_ids(owner, count)) is not None]
    if len({tuple(ids) for _, ids in found}) > 1:
        shown = "; ".join(f"{p or 'pool'}.model_layer_ids={short_repr(ids)}" for p, ids in found)
        raise InconsistentLayersError(f"{type(pool).__name__}: the attrs= owners disagree: {shown}")
    return found[0][1] if found else None


def _model_layer_ids(pool: object, count: int) -> list[int] | None:
    """SGLang's ``model_layer_ids``: the global ids of this pool's layers, if it has them."""
    model_ids = probe(pool, "model_layer_ids")
    if model_ids is None:
        return None
    where = f"{type(pool).__name__}.model_layer_ids"
    ids = read_integer_list(model_ids, where, InconsistentLayersError)  # numpy/torch 1-D arrays too
    if len(ids) != count or len(set(ids)) != count:
        raise InconsistentLayersError(
            f"{where}={short_repr(model_ids, 200)}: expected {count} distinct layer ids (integers), one per layer"
        )
    return ids


def compact_default(sub: object, count: int) -> bool:
    """Whether ``sub.model_layer_ids`` is SGLang's compact default ``range(start_layer, start_layer + n)``.

    SGLang 0.5.23 patches the wrapper's ids onto an MHA child only (``memory_pool.py``, "Only the hybrid
    root knows the model IDs of its compact child"); an MLA child keeps this default, which says nothing
    about where its layers sit in the model: the wrapper's mapping is the truth there.
    """
    start = probe_int(sub, "start_layer") or 0
    ids = _model_layer_ids(sub, count)
    return ids is None or ids == list(range(start, start + count))


def _agree(name: str, option: str, ids: list[int], model_ids: list[int] | None) -> None:
    if model_ids is not None and ids != model_ids:
        raise InconsistentLayersError(
            f"{name}: option {option} gives layers {ids} but {name}.model_layer_ids is {model_ids}; "
            f"drop the option or fix the pool"
        )


def mapped_layer_ids(pool: object, structure: HybridStructure, view: PoolView, options: set[str]) -> PoolView:
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
    if not compact_default(structure.primary, len(mapped)):
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
    structure = detect(pool) if owner in ("full_kv_pool", "swa_kv_pool", "main_pool") else None
    ids = tuple(g for g, attr, _ in structure.backing if attr == owner) if structure else ()
    if structure is None or not ids:
        return view
    sub = replace(structure, primary_attr=owner, primary=probe(pool, owner), layer_ids=ids)
    check_wrapper_page_size(pool, sub)  # the same rule as for the unwrapped wrapper (readers.sources.locate_source)
    return mapped_layer_ids(pool, sub, view, options)
