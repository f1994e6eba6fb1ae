"""Recognise a pool: locate its KV tensors and list the readings of their axes that fit.

Recognition works by attributes and shapes, never by class names. It has two steps:

1. *Locate*: find the containers that hold KV tensors, either the pool itself (a tensor, a list or
   tuple, a vLLM-style dict of layer name -> tensor, a pair of K and V lists) or named attributes
   from the name table (built-ins plus :func:`register_attribute_names`).
2. *Candidates*: for each located family, the axis readings that apply to it, each checked against
   the known :class:`~flexkv_adapter.layout.Geometry`. A reading that does not fit says why, so an
   "unsupported pool" error can list every reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .axes import Axis, parse_axes
from .layout import Geometry, Interpretation, Plane, ViewKind

SELF = "<pool>"


@dataclass(frozen=True)
class NameRule:
    """Attribute names that hold KV tensors: one name (K and V together, or MLA) or two (K, V)."""

    family: str
    names: tuple[str, ...]
    kinds: frozenset[ViewKind]


_BOTH: frozenset[ViewKind] = frozenset({"mha", "mla"})
_MHA: frozenset[ViewKind] = frozenset({"mha"})
_MLA: frozenset[ViewKind] = frozenset({"mla"})

_BUILTIN_RULES: tuple[NameRule, ...] = (
    NameRule("sglang-mha", ("k_buffer", "v_buffer"), _MHA),
    NameRule("sglang-mla", ("kv_buffer",), _MLA),
    NameRule("renamed", ("k_cache", "v_cache"), _MHA),
    NameRule("renamed", ("key_cache", "value_cache"), _MHA),
    NameRule("renamed", ("k_buffers", "v_buffers"), _MHA),
    NameRule("renamed", ("k_caches", "v_caches"), _MHA),
    NameRule("renamed", ("kv_cache",), _BOTH),
    NameRule("renamed", ("kv_caches",), _BOTH),
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
        raise ValueError(f"register_attribute_names takes one or two attribute names, got {names!r}")
    if len(names) == 2 and kind == "mla":
        raise ValueError("two names mean separate K and V buffers, which is MHA; MLA takes one name")
    kinds = frozenset({kind}) if kind else (_BOTH if len(names) == 1 else _MHA)
    rule = NameRule(family, tuple(names), kinds)
    if rule not in _user_rules:
        _user_rules.append(rule)


def unregister_attribute_names(*names: str) -> None:
    """Forget names registered with :func:`register_attribute_names`."""
    _user_rules[:] = [r for r in _user_rules if r.names != tuple(names)]


@dataclass(frozen=True)
class Container:
    """Tensors found under one attribute: a sequence (one per layer) or a single tensor."""

    attr: str
    tensors: tuple[torch.Tensor, ...]
    is_sequence: bool
    layer_ids: tuple[int, ...] | None = None
    ids_problem: str | None = None


@dataclass(frozen=True)
class Located:
    """A family of containers: one (combined K/V or MLA) or two (K, V)."""

    family: str
    containers: tuple[Container, ...]
    kinds: frozenset[ViewKind]

    @property
    def attrs(self) -> tuple[str, ...]:
        return tuple(c.attr for c in self.containers)

    @property
    def split(self) -> bool:
        return len(self.containers) == 2


def layer_index_from_name(name: str) -> int | None:
    """The one integer component of a dotted layer name (``model.layers.12.attn`` -> 12)."""
    ints = [int(part) for part in str(name).split(".") if part.isdigit()]
    return ints[0] if len(ints) == 1 else None


def resolve_attr(obj: object, path: str) -> object:
    """``getattr`` along a dotted path (``full_kv_pool.k_buffer``); None if any step is missing."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _container(attr: str, value: object) -> Container | str:
    if isinstance(value, torch.Tensor):
        return Container(attr, (value,), is_sequence=False)
    if isinstance(value, Mapping):
        items = list(value.items())
        if not items or not all(isinstance(t, torch.Tensor) for _, t in items):
            return f"{attr} is a dict but not a non-empty dict of tensors"
        ids = [layer_index_from_name(k) for k, _ in items]
        if any(i is None for i in ids) or len(set(ids)) != len(ids):
            problem = (
                f"{attr}: cannot take one distinct layer index from each name "
                f"{[k for k, _ in items][:4]}...; pass layer_ids=[...] in the dict's order"
            )
            return Container(attr, tuple(t for _, t in items), True, None, problem)
        order = sorted(range(len(items)), key=lambda i: ids[i])  # type: ignore[arg-type,return-value]
        return Container(
            attr,
            tuple(items[i][1] for i in order),
            True,
            tuple(ids[i] for i in order),  # type: ignore[misc]
        )
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(t, torch.Tensor) for t in value):
            return f"{attr} is a {type(value).__name__} but not a non-empty sequence of tensors"
        return Container(attr, tuple(value), is_sequence=True)
    return f"{attr} is {type(value).__name__}, not a tensor, a sequence of tensors or a dict of them"


def _is_tensor_seq(x: object) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(t, torch.Tensor) for t in x)


def locate(pool: object, attrs: Sequence[str] | None = None) -> tuple[list[Located], list[str]]:
    """Find KV tensor containers on ``pool``; return them and the reasons others declined."""
    found: list[Located] = []
    declined: list[str] = []
    absent: list[str] = []
    if attrs:
        rules: Iterable[NameRule] = [NameRule("attrs", tuple(attrs), _MHA if len(attrs) == 2 else _BOTH)]
    elif isinstance(pool, torch.Tensor):
        return [Located("flat-tensor", (Container(SELF, (pool,), False),), _BOTH)], []
    elif isinstance(pool, Mapping):
        c = _container(SELF, pool)
        return ([Located("vllm-dict", (c,), _BOTH)], []) if isinstance(c, Container) else ([], [c])
    elif isinstance(pool, (list, tuple)):
        if len(pool) == 2 and all(_is_tensor_seq(x) for x in pool):
            k, v = (Container(f"{SELF}[{i}]", tuple(pool[i]), True) for i in (0, 1))
            return [Located("kv-pair-lists", (k, v), _MHA)], []
        c = _container(SELF, pool)
        return ([Located("sequence", (c,), _BOTH)], []) if isinstance(c, Container) else ([], [c])
    else:
        rules = (*_user_rules, *_BUILTIN_RULES)
    for rule in rules:
        values = [resolve_attr(pool, n) for n in rule.names]
        missing = [n for n, v in zip(rule.names, values) if v is None]
        if len(missing) == len(rule.names):
            absent.append("/".join(rule.names))
            continue
        if missing:
            present = [n for n in rule.names if n not in missing]
            declined.append(f"{rule.family}: has {'/'.join(present)} but no {'/'.join(missing)} (or it is None)")
            continue
        made = [_container(n, v) for n, v in zip(rule.names, values)]
        problems = [m for m in made if isinstance(m, str)]
        if problems:
            declined.append(f"{rule.family}: {'; '.join(problems)}")
            continue
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


def builtin_readings() -> list[tuple[str, tuple[str, ...], Interpretation]]:
    """(family, attribute names, reading) for every built-in rule and pool shape."""
    out: list[tuple[str, tuple[str, ...], Interpretation]] = []
    for rule in (*_user_rules, *_BUILTIN_RULES):
        split = len(rule.names) == 2
        for sequence in (True, False):
            out += [(rule.family, rule.names, i) for i in _READINGS[(split, sequence)] if i.kind in rule.kinds]
    out += [("flat-tensor", (), i) for i in _READINGS[(False, False)]]
    out += [(family, (), i) for family in ("vllm-dict", "sequence") for i in _READINGS[(False, True)]]
    out += [("kv-pair-lists", (), i) for i in _READINGS[(True, True)]]
    return out


def candidates(located: Located, geometry: Geometry) -> list[Interpretation]:
    """The readings to try for a located family, honouring declared axes and kind."""
    sequence = located.containers[0].is_sequence
    if geometry.axes is not None:
        kind: ViewKind = geometry.kind or ("mha" if located.split or Axis.KV in geometry.axes else "mla")
        return [Interpretation(kind, geometry.axes, Axis.LAYER not in geometry.axes)]
    table = _READINGS[(located.split, sequence)]
    return [i for i in table if i.kind in located.kinds and geometry.kind in (None, i.kind)]


def plane_sources(located: Located, interp: Interpretation) -> list[tuple[Plane, Container, int | None]]:
    """(plane, container, index on the KV axis) for each plane of the reading."""
    if located.split:
        return [("k", located.containers[0], None), ("v", located.containers[1], None)]
    if interp.kind == "mla":
        return [("kv", located.containers[0], None)]
    return [("k", located.containers[0], 0), ("v", located.containers[0], 1)]


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
    if located.split and len(located.containers[0].tensors) != len(located.containers[1].tensors):
        k, v = located.containers
        return f"{k.attr} has {len(k.tensors)} entries but {v.attr} has {len(v.tensors)}"
    for plane, container, _ in plane_sources(located, interp):
        if container.is_sequence != interp.per_layer and not (interp.per_layer and len(container.tensors) == 1):
            return f"{container.attr} is {'a sequence' if container.is_sequence else 'one tensor'}"
        first = container.tensors[0]
        for i, t in enumerate(container.tensors):
            if t.ndim != len(axes):
                return f"{container.attr}[{i}] has {t.ndim} dims but [{interp.axes_text}] has {len(axes)}"
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
    return None
