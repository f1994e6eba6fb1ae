"""Recognise a pool: locate its KV tensors and list the readings of their axes that fit.

Recognition works by attributes and shapes, never by class names. It has two steps:

1. *Locate*: find the containers that hold KV tensors, either the pool itself (a tensor, a list or
   tuple, a vLLM-style dict of layer name -> tensor, a pair of K and V lists) or named attributes
   from the name table (built-ins plus :func:`register_attribute_names`).
2. *Candidates*: for each located family, the axis readings that apply to it, each checked against
   the known :class:`~flexkv_adapter.model.layout.Geometry`. A reading that does not fit says why, so an
   "unsupported pool" error can list every reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..errors import AdapterError, NotAddressableError
from ..model.axes import Axis, format_axes, parse_axes
from ..model.layout import Geometry, Interpretation, Plane, ViewKind
from ..text import short_repr
from .containers import (
    BOTH,
    MHA,
    MLA,
    SELF,
    Container,
    Located,
    copy_problem,
    locate_sequence,
    make_container,
    pairing_problem,
    probe_path,
    read_again,
)
from .vllm_layout import vllm_twin


@dataclass(frozen=True)
class NameRule:
    """Attribute names that hold KV tensors: one name (K and V together, or MLA) or two (K, V)."""

    family: str
    names: tuple[str, ...]
    kinds: frozenset[ViewKind]


_BUILTIN_RULES: tuple[NameRule, ...] = (
    NameRule("sglang-mha", ("k_buffer", "v_buffer"), MHA),
    NameRule("sglang-mla", ("kv_buffer",), MLA),
    NameRule("renamed", ("k_cache", "v_cache"), MHA),
    NameRule("renamed", ("key_cache", "value_cache"), MHA),
    NameRule("renamed", ("k_buffers", "v_buffers"), MHA),
    NameRule("renamed", ("k_caches", "v_caches"), MHA),
    NameRule("renamed", ("kv_cache",), BOTH),
    NameRule("renamed", ("kv_caches",), BOTH),
)
_user_rules: list[NameRule] = []


def register_attribute_names(*names: str, kind: ViewKind | None = None, family: str = "user") -> None:
    """Teach :func:`adapt` a pool's attribute names.

    Pass one name for an attribute holding K and V together (``[2, ...]``) or MLA rows, or two
    names for separate K and V. ``kind`` restricts the readings ("mha" or "mla"); by default one
    name allows both and two names mean MHA. User names are tried alongside the built-ins; if both
    match a pool with different meanings, :func:`adapt` raises an ambiguity error.
    """
    if len(names) not in (1, 2) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise AdapterError(f"register_attribute_names takes one or two attribute names, got {short_repr(names)}")
    if kind not in (None, "mha", "mla"):
        raise AdapterError(f"kind must be 'mha', 'mla' or None, got {short_repr(kind)}")
    if not isinstance(family, str):
        raise AdapterError(f"family must be a string, got {short_repr(family)}")
    if len(names) == 2 and kind == "mla":
        raise AdapterError("two names mean separate K and V buffers, which is MHA; MLA takes one name")
    kinds = frozenset({kind}) if kind else (BOTH if len(names) == 1 else MHA)
    rule = NameRule(family, tuple(names), kinds)
    if rule not in _user_rules:
        _user_rules.append(rule)


def unregister_attribute_names(*names: str) -> None:
    """Forget names registered with :func:`register_attribute_names`."""
    _user_rules[:] = [r for r in _user_rules if r.names != tuple(names)]


def locate(pool: object, attrs: Sequence[str] | None = None) -> tuple[list[Located], list[str]]:
    """Find KV tensor containers on ``pool``; return them and the reasons others declined."""
    found: list[Located] = []
    declined: list[str] = []
    absent: list[str] = []
    if attrs:
        rules: Iterable[NameRule] = [NameRule("attrs", tuple(attrs), MHA if len(attrs) == 2 else BOTH)]
    elif isinstance(pool, torch.Tensor):
        c = make_container(SELF, pool)
        return ([Located("flat-tensor", (c,), BOTH)], []) if isinstance(c, Container) else ([], [c])
    elif isinstance(pool, Mapping):
        c = make_container(SELF, pool)
        if isinstance(c, Container) and (why := copy_problem(c, pool, read_again(pool))):  # identity, as attributes
            raise NotAddressableError(f"{type(pool).__name__}: {why}")
        return ([Located("vllm-dict", (c,), BOTH)], []) if isinstance(c, Container) else ([], [c])
    elif isinstance(pool, (list, tuple)):
        return locate_sequence(pool)
    else:
        rules = (*_user_rules, *_BUILTIN_RULES)
    for rule in rules:
        values = [probe_path(pool, n) for n in rule.names]
        missing = [n for n, v in zip(rule.names, values) if v is None]
        if len(missing) == len(rule.names):
            absent.append("/".join(rule.names))
            continue
        if missing:
            present = [n for n in rule.names if n not in missing]
            declined.append(f"{rule.family}: has {'/'.join(present)} but no {'/'.join(missing)} (or it is None)")
            continue
        made = [make_container(n, v) for n, v in zip(rule.names, values)]
        problems = [m for m in made if isinstance(m, str)]
        if problems:
            declined.append(f"{rule.family}: {'; '.join(problems)}")
            continue
        for name, value, container in zip(rule.names, values, made):  # identity: read twice, the same memory
            if isinstance(container, Container) and (why := copy_problem(container, value, probe_path(pool, name))):
                raise NotAddressableError(f"{type(pool).__name__}.{why}")
        found.append(Located(rule.family, tuple(m for m in made if isinstance(m, Container)), rule.kinds))
    if absent:
        declined.append(f"none of these attributes is present (or they are None): {', '.join(absent)}")
    return found, declined


# Readings tried when no axes are declared. Per-layer readings apply to sequences, whole-pool
# readings (with an L axis) to a single tensor. MLA readings need a head axis of 1 (or none).
# Readings FlexKV cannot address stay in the tables: recognising them turns a shape coincidence
# into an ambiguity (or a clear refusal) instead of a silently wrong view.
_SPLIT_PER_LAYER = (("mha", "N H D"), ("mha", "P T H D"), ("mha", "P H T D"))
_SPLIT_WHOLE = (("mha", "L N H D"), ("mha", "L P T H D"))
_COMBINED_PER_LAYER = (
    ("mla", "N H D"),
    ("mla", "P T D"),
    ("mha", "KV N H D"),
    ("mha", "KV P T H D"),  # vLLM <= 0.21 per-layer
    ("mha", "P KV T H D"),  # vLLM >= 0.23 per-layer (recognised, then refused as not addressable)
    ("mha", "KV P H T D"),  # head-major (HND) twins: same shapes, so they make a guess an ambiguity
    ("mha", "P KV H T D"),
)
_COMBINED_WHOLE = (
    ("mla", "L N D"),
    ("mla", "L N H D"),
    ("mha", "L KV N H D"),
    ("mha", "KV L N H D"),
    ("mha", "N L KV H D"),  # token-major across layers (recognised, then refused)
    ("mha", "P L KV T H D"),  # block-first (TensorRT-LLM style): flexkv_adapter.flexkv.plan registers it whole
)


_READINGS: dict[tuple[bool, bool], tuple[Interpretation, ...]] = {
    (split, sequence): tuple(Interpretation(k, parse_axes(a), per_layer=sequence) for k, a in table)  # type: ignore[arg-type]
    for (split, sequence), table in {
        (True, True): _SPLIT_PER_LAYER,
        (True, False): _SPLIT_WHOLE,
        (False, True): _COMBINED_PER_LAYER,
        (False, False): _COMBINED_WHOLE,
    }.items()
}


_KV_NHD = parse_axes("KV N H D")
_PAIR_OF_ONE_LAYER = Interpretation("mha", parse_axes("N H D"), per_layer=True)


def builtin_readings() -> list[tuple[str, tuple[str, ...], Interpretation]]:
    """(family, attribute names, reading) for every built-in rule and pool shape."""
    out: list[tuple[str, tuple[str, ...], Interpretation]] = []
    for rule in (*_user_rules, *_BUILTIN_RULES):
        split = len(rule.names) == 2
        for sequence in (True, False):
            out += [(rule.family, rule.names, i) for i in _READINGS[(split, sequence)] if i.kind in rule.kinds]
    out += [("flat-tensor", (), i) for i in _READINGS[(False, False)]]
    out += [(family, (), i) for family in ("vllm-dict", "sequence") for i in _READINGS[(False, True)]]
    nested = (("kv-pair-lists", (Axis.KV, Axis.LAYER), True), ("layer-pairs", (Axis.LAYER, Axis.KV), True))
    for family, outer, sequence in (*nested, ("kv-pair-tensors", (Axis.KV,), False)):
        # written with the container axes, so each reads only its own family (see tensor_axes)
        out += [(family, (), Interpretation(i.kind, (*outer, *i.axes), False)) for i in _READINGS[(True, sequence)]]
    out.append(("kv-pair-tensors", (), Interpretation("mha", (Axis.KV, *_PAIR_OF_ONE_LAYER.axes), True)))
    return out


def candidates(located: Located, geometry: Geometry) -> list[Interpretation]:
    """The readings to try for a located family, honouring declared axes and kind."""
    sequence = located.containers[0].is_sequence
    if geometry.axes is not None:
        axes = tensor_axes(located, geometry.axes)
        if located.outer == (Axis.KV,) and axes == geometry.axes and Axis.LAYER not in axes:
            return []  # a [k, v] pair is read per layer only where the axes name its KV level: "KV N H D"
        kind: ViewKind = geometry.kind or ("mha" if located.split or Axis.KV in axes else "mla")
        return [Interpretation(kind, axes, Axis.LAYER not in axes)]
    table = _READINGS[(located.split, sequence)]
    if located.outer == (Axis.KV,):  # [k, v] of one layer: single-head K/V also read as two MLA layers
        table = (*table, _PAIR_OF_ONE_LAYER)
    return [i for i in table if i.kind in located.kinds and geometry.kind in (None, i.kind)]


def vllm_twin_of(located: Located, interp: Interpretation) -> str | None:
    """The vLLM 0.33 reading that fits as well as ``interp`` (a dict or list of views of one buffer,
    wherever it is nested): the same rule :func:`~flexkv_adapter.readers.vllm_layout.is_vllm_dict` applies to
    a dict passed directly."""
    container = located.containers[0]
    if located.split or not container.is_sequence or interp.axes != _KV_NHD:
        return None
    twin = vllm_twin(container.tensors)
    return f"{container.attr}: {len(container.tensors)} {twin}" if twin else None


def tensor_axes(located: Located, axes: tuple[Axis, ...]) -> tuple[Axis, ...]:
    """Declared axes minus the leading ones the containers form (``L KV`` for (k, v) pairs)."""
    n = len(located.outer)
    return axes[n:] if n and axes[:n] == located.outer and Axis.DIM in axes[n:] else axes


def declared_axes(located: Located, interp: Interpretation) -> str:
    """The ``axes=`` that selects ``interp`` of ``located`` (with the container axes when they matter)."""
    outer = located.outer if Axis.KV in located.outer else ()
    return format_axes((*outer, *interp.axes))


def reading_text(located: Located, interp: Interpretation) -> str:
    """The report's reading; for a list whose levels are L and KV, the full axes that select it."""
    return f"{interp.kind.upper()} [{declared_axes(located, interp)}]" if Axis.KV in located.outer else str(interp)


def plane_sources(located: Located, interp: Interpretation) -> list[tuple[Plane, Container, int | None]]:
    """(plane, container, index on the KV axis) for each plane of the reading."""
    if located.split:
        return [("k", located.containers[0], None), ("v", located.containers[1], None)]
    if interp.kind == "mla":
        return [("kv", located.containers[0], None)]
    return [("k", located.containers[0], 0), ("v", located.containers[0], 1)]


def _layers_disagree(container: Container, axes: tuple[Axis, ...]) -> str | None:
    """A layer whose K/V, token, head or dim extent differs from layer 0's (rows may differ: that is
    reported later, as inconsistent layers)."""
    first = dict(zip(axes, container.tensors[0].shape))
    for i, t in enumerate(container.tensors):
        for axis, size in zip(axes, t.shape):
            if axis in (Axis.KV, Axis.TOKEN, Axis.HEAD, Axis.DIM) and size != first[axis]:
                return f"{container.attr}[{i}]: axis {axis.value} has extent {size} but layer 0's has {first[axis]}"
    return None


def mismatch(located: Located, interp: Interpretation, geometry: Geometry) -> str | None:
    """Why ``interp`` does not fit the located tensors and geometry, or None if it fits."""
    axes = interp.axes
    has_kv = Axis.KV in axes
    if located.split and has_kv:
        return "separate K and V containers cannot have a KV axis"
    if not located.split and (interp.kind == "mha") != has_kv:
        return "MHA in one container needs a KV axis; MLA has none"
    if interp.kind not in located.kinds:
        return f"{located.family} attributes do not hold {interp.kind.upper()} buffers"
    if interp.per_layer == (Axis.LAYER in axes):
        return "a per-layer reading cannot have an L axis"
    if located.outer == (Axis.KV,) and interp.per_layer and interp != _PAIR_OF_ONE_LAYER:
        return "a [K, V] pair of tensors is read whole: its axes need L (a list of per-layer tensors has none)"
    if located.split and len(located.containers[0].tensors) != len(located.containers[1].tensors):
        k, v = located.containers
        return f"{k.attr} has {len(k.tensors)} entries but {v.attr} has {len(v.tensors)}"
    if located.split and (why := pairing_problem(*located.containers)):
        return why
    counts: list[tuple[str, int]] = []
    for plane, container, _ in plane_sources(located, interp):
        if container.is_sequence != interp.per_layer and not (interp.per_layer and len(container.tensors) == 1):
            return f"{container.attr} is {'a sequence' if container.is_sequence else 'one tensor'}"
        first = container.tensors[0]
        for i, t in enumerate(container.tensors):
            if t.ndim != len(axes):
                return f"{container.attr}[{i}] has {t.ndim} dims but [{interp.axes_text}] has {len(axes)}"
        if not container.uniform and (why := _layers_disagree(container, axes)):
            return why
        extent = dict(zip(axes, first.shape))
        layers = len(container.tensors) if interp.per_layer else extent[Axis.LAYER]
        head = extent.get(Axis.HEAD, 1)
        dim_fact = {"k": "head_dim", "v": "v_head_dim", "kv": "kv_dim"}[plane]
        want: list[tuple[str, int, int | None, str]] = [
            ("layers", layers, geometry.layer_num, geometry.origin("layer_num")),
            ("heads", head, 1, "MLA rows have one head")
            if interp.kind == "mla"
            else ("heads", head, geometry.head_num, geometry.origin("head_num")),
            ("D", extent[Axis.DIM], geometry.expected_dim(plane), geometry.origin(dim_fact)),
        ]
        if Axis.KV in extent:
            want.append(("KV axis", extent[Axis.KV], 2, "K and V"))
        if Axis.TOKEN in extent:
            want.append(("tokens per page", extent[Axis.TOKEN], geometry.page_size, geometry.origin("page_size")))
        for what, got, expected, origin in want:
            if expected is not None and got != expected:
                return f"{container.attr}: {what} would be {got}, expected {expected} ({origin})"
        rows = extent.get(Axis.ROWS) or extent[Axis.PAGE] * extent[Axis.TOKEN]
        if geometry.page_size is not None and rows < geometry.page_size:
            return (
                f"{container.attr}: {rows} rows per layer, fewer than page_size={geometry.page_size} "
                f"({geometry.origin('page_size')}); FlexKV needs at least one whole block"
            )
        counts.append((container.attr, layers))
    if len({n for _, n in counts}) > 1:
        return f"the planes disagree on the number of layers: {', '.join(f'{a} has {n}' for a, n in counts)}"
    return None
