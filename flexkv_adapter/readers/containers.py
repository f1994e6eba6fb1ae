"""How a pool's attributes are read, and the containers of KV tensors found under them.

Pools are arbitrary objects. A property may raise (SGLang asserts a feature is enabled), a
``__getattr__`` may recurse, a dotted path may cross a ``None``. :func:`probe` reads them, the one place
every stage reads a pool's attributes, and turns each such failure into an
:class:`~flexkv_adapter.errors.AdapterError` that names the attribute, instead of a traceback from deep
inside recognition.

A :class:`Container` is the tensors under one attribute (a sequence, one per layer, or a single
tensor); a :class:`Located` family is one or two of them (combined K/V or MLA, or separate K and
V). Tensors without real memory (meta, fake, sparse) are declined here, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import torch

from ..config.integers import looks_numeric, read_integer
from ..errors import AdapterError, InconsistentLayersError
from ..model.axes import Axis
from ..model.copy_rules import storage_problem
from ..model.layout import ViewKind
from ..text import short_repr

SELF = "<pool>"
BOTH: frozenset[ViewKind] = frozenset({"mha", "mla"})
MHA: frozenset[ViewKind] = frozenset({"mha"})
MLA: frozenset[ViewKind] = frozenset({"mla"})


def probe(obj: object, name: str, *, tolerate: bool = False) -> Any:
    """``getattr(obj, name, None)``; an attribute that raises is an AdapterError (or None if ``tolerate``)."""
    try:
        value = getattr(obj, name, None)
        value.__class__  # noqa: B018 -- isinstance() reads it: one that raises is this attribute's fault
        return value
    except Exception as exc:  # RecursionError included: a recursive __getattr__
        if tolerate:
            return None
        raise AdapterError(
            f"{type(obj).__name__}.{name} raised {type(exc).__name__} when read: {str(exc)[:200]}; "
            f"fix the pool's attribute, or name the KV tensors with attrs=[...]"
        ) from None


def own_class(value: object, where: str) -> None:
    """Refuse an entry point's input whose ``__class__`` raises or is not its type: ``isinstance()`` reads
    ``__class__``, so one that raises escapes every check, and one that lies (a proxy) passes for what it is not."""
    try:
        claimed = value.__class__
    except Exception as exc:
        raise AdapterError(
            f"{where}: reading its __class__ raised {type(exc).__name__}: {str(exc)[:120]}; pass the pool itself"
        ) from None
    if claimed is not type(value):
        raise AdapterError(
            f"{where}: a {type(value).__name__} whose __class__ says {short_repr(claimed)}; a proxy is not read as "
            f"what it stands for: pass the object itself"
        )


def probe_path(obj: object, path: str) -> Any:
    """``probe`` along a dotted path (``full_kv_pool.k_buffer``); None if any step is missing."""
    for part in path.split("."):
        obj = probe(obj, part)
        if obj is None:
            return None
    return obj


def attr_owners(pool: object, attrs: Sequence[str] | None) -> list[tuple[str, object]]:
    """(path, object) of each object holding a named attribute (``pool.inner`` for ``inner.k_buffer``).

    Its metadata describes those tensors, as a top-level pool's describes its own; no attrs: the pool.
    """
    paths = sorted({a.rpartition(".")[0] for a in attrs or ()}) or [""]
    return [(p, probe_path(pool, p) if p else pool) for p in paths]


def probe_int(obj: object, name: str) -> int | None:
    """An integer attribute, read by :func:`~flexkv_adapter.config.integers.read_integer` (numpy and 0-d tensor
    integers too); None if absent or not a number at all. A number that is not an integer (a bool, a float,
    a meta tensor) is malformed metadata: an AdapterError, never silently ignored."""
    value = probe(obj, name)
    if value is None or not looks_numeric(value):
        return None
    return read_integer(value, f"{type(obj).__name__}.{name}", InconsistentLayersError)


@dataclass(frozen=True)
class Container:
    """Tensors found under one attribute: a sequence (one per layer) or a single tensor."""

    attr: str
    tensors: tuple[torch.Tensor, ...]
    is_sequence: bool
    layer_ids: tuple[int, ...] | None = None  # from dict names, in the (sorted) order of ``tensors``
    ids_problem: str | None = None
    dict_order: tuple[int, ...] | None = None  # a dict's entries: each tensor's position in the dict
    names: tuple[object, ...] | None = None  # a dict's keys (as given), in the order of ``tensors``

    @property
    def keyed(self) -> bool:
        return self.dict_order is not None

    @cached_property
    def uniform(self) -> bool:
        """Every tensor has the first one's shape (then checking the first checks them all)."""
        first = self.tensors[0].shape
        return all(t.shape == first for t in self.tensors)


@dataclass(frozen=True)
class Located:
    """A family of containers: one (combined K/V or MLA) or two (K, V)."""

    family: str
    containers: tuple[Container, ...]
    kinds: frozenset[ViewKind]
    outer: tuple[Axis, ...] = ()  # axes the containers themselves form (a list of (k, v) pairs: L KV)

    @property
    def attrs(self) -> tuple[str, ...]:
        return tuple(c.attr for c in self.containers)

    @property
    def split(self) -> bool:
        return len(self.containers) == 2


def layer_index_from_name(name: object) -> int | None:
    """The one integer component of a dotted layer name (``model.layers.12.attn`` -> 12).

    Only ASCII digits, at most 9 of them: ``int()`` also reads other scripts' digits, and a
    thousand-digit "index" is not a layer.
    """
    if isinstance(name, int) and not isinstance(name, bool):  # {0: t, 1: t}; any other non-str key names no layer
        return int(name) if 0 <= name < 10**9 else None
    if not isinstance(name, str):  # its (bounded) repr would be a guess: a cut-off text may hide a second index
        return None
    ints = [int(p) for p in str.__str__(name).split(".") if p.isascii() and p.isdigit() and len(p) <= 9]
    return ints[0] if len(ints) == 1 else None


def key_text(name: object) -> str:
    """A dict key as text: a str as it is (a subclass's own ``__str__`` is not asked), anything else through the
    bounded repr, which never raises (a key whose ``__str__`` raises, or spells megabytes)."""
    return str.__str__(name) if isinstance(name, str) else short_repr(name, 200)


def _storage_problem(attr: str, tensors: Sequence[torch.Tensor]) -> str | None:
    for i, t in enumerate(tensors):
        why = storage_problem(t)
        if why:
            where = f"{attr}[{i}]" if len(tensors) > 1 else attr
            return f"{where} {why}: nothing there can be offloaded"
    return None


def plain(value: object) -> object:
    """A list or tuple subclass as the plain container of what it holds, read with the base type's own methods:
    a subclass's ``__iter__``, ``__len__``, ``__bool__`` or ``__getitem__`` may raise or lie, and the pool's
    tensors are what it holds, not what those methods say. (A dict subclass keeps its own reading: its items()
    is read twice and compared, :func:`read_again`.)"""
    if type(value) in (list, tuple) or not isinstance(value, (list, tuple)):
        return value
    return list(list.__iter__(value)) if isinstance(value, list) else tuple(tuple.__iter__(value))


def make_container(attr: str, value: object) -> Container | str:
    value = plain(value)
    if isinstance(value, torch.Tensor):
        return _storage_problem(attr, (value,)) or Container(attr, (value,), is_sequence=False)
    if isinstance(value, Mapping):
        try:
            items = list(value.items())
        except Exception as exc:  # a Mapping subclass whose items() fails
            return f"{attr} is a {type(value).__name__} whose items() raised {type(exc).__name__}: {str(exc)[:120]}"
        if not items or not all(isinstance(t, torch.Tensor) for _, t in items):
            return f"{attr} is a dict but not a non-empty dict of tensors"
        if why := _storage_problem(attr, [t for _, t in items]):
            return why
        ids = [layer_index_from_name(k) for k, _ in items]
        if any(i is None for i in ids) or len(set(ids)) != len(ids):
            names = [key_text(k)[:60] for k, _ in items[:4]]
            problem = (
                f"{attr}: cannot take one distinct layer index from each name {names}"
                f"{'...' if len(items) > 4 else ''}; pass layer_ids=[...] in the dict's order"
            )
            keys = tuple(k for k, _ in items)
            return Container(attr, tuple(t for _, t in items), True, None, problem, tuple(range(len(items))), keys)
        order = sorted(range(len(items)), key=lambda i: ids[i])  # type: ignore[arg-type,return-value]
        return Container(
            attr,
            tuple(items[i][1] for i in order),
            True,
            tuple(ids[i] for i in order),  # type: ignore[misc]
            dict_order=tuple(order),
            names=tuple(items[i][0] for i in order),
        )
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(t, torch.Tensor) for t in value):
            return f"{attr} is a {type(value).__name__} but not a non-empty sequence of tensors"
        return _storage_problem(attr, value) or Container(attr, tuple(value), is_sequence=True)
    return f"{attr} is {type(value).__name__}, not a tensor, a sequence of tensors or a dict of them"


def _tensors_of(value: object, order: tuple[int, ...] | None) -> list[object]:
    value = plain(value)
    if isinstance(value, Mapping):
        items = list(value.values())
        return [items[i] for i in order] if order is not None else items
    return list(value) if isinstance(value, (list, tuple)) else [value]


def addresses(value: object) -> tuple[object, ...]:
    """The data pointers of the tensors a value holds (a tensor, a list/tuple or a dict of them)."""
    return tuple(t.data_ptr() if isinstance(t, torch.Tensor) else None for t in _tensors_of(value, None))


def read_again(pool: Mapping[Any, object]) -> object:
    """A mapping's entries read a second time, by key (its items() gave the first read); None if that fails.
    The keys are items()' own, in its order, so the reads compare name by name (keys() may list another order)."""
    try:
        return {k: pool[k] for k, _ in list(pool.items())}
    except Exception:  # a mapping whose keys() or [] raise: copy_problem reports new memory
        return None


def _memory(t: torch.Tensor) -> tuple[object, ...]:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def same_memory(first: Sequence[torch.Tensor], second: object) -> bool:
    """Whether a second read (a tensor, or a list/tuple of them) holds the first read's memory, tensor by tensor:
    compared by storage, offset, shape and strides, never by object identity (a getter may refill the same list
    object with copies, or return new views of the same memory)."""
    try:
        items = list(second) if isinstance(second, (list, tuple)) else [second]
        return len(items) == len(first) and all(
            isinstance(b, torch.Tensor) and _memory(a) == _memory(b) for a, b in zip(first, items)
        )
    except Exception:  # a second read that is not even a container of tensors
        return False


def copy_problem(first: Container, value: object, again: object) -> str | None:
    """Why a second read of an attribute shows it is not the pool's memory (a getter that copies), or None.

    A property returning ``.clone()``, or ``.contiguous()`` of a non-contiguous tensor, gives new memory on
    every read: a view of it aliases a temporary, so FlexKV's writes would never reach the pool. The second
    read is compared by memory even when it is the same object as the first (a list refilled in place).
    """
    try:
        second: object = _tensors_of(again, first.dict_order)
    except Exception:  # a second read that is not even a container of tensors
        second = None
    if same_memory(first.tensors, second):
        return _still_there(first)
    return (
        f"{first.attr} gives new memory on every read (two reads returned tensors at different addresses): "
        f"a property that copies (.clone(), .contiguous() of a non-contiguous tensor). A view of it would "
        f"alias a temporary and nothing written through it would reach the pool. Fix: expose the pool's own "
        f"tensors (the storage, not a copy), or name them with attrs=[...]"
    )


def _still_there(first: Container) -> str | None:
    """Why the first read's tensors lost their memory during the second read (a getter that resized or freed
    the storage leaves them dangling), or None."""
    for i, t in enumerate(first.tensors):
        if why := storage_problem(t):
            return f"{first.attr}[{i}] {why}; it changed between two reads of the attribute"
    return None


def pairing_problem(k: Container, v: Container) -> str | None:
    """Why separate K and V containers cannot be paired layer by layer, or None.

    Named layers pair by their ids; otherwise by position, which only means the same layer when
    both are lists, or dicts with the same keys in the same order: a list beside a dict (sorted by
    its names, or in its own order?) or two dicts of different keys is a guess.
    """
    if k.layer_ids is not None and v.layer_ids is not None:
        if k.layer_ids == v.layer_ids:
            return None
        return f"{k.attr} names layers {list(k.layer_ids)} but {v.attr} names {list(v.layer_ids)}"
    if len(k.tensors) == 1:
        return None
    if k.keyed != v.keyed or k.layer_ids != v.layer_ids:

        def form(c: Container) -> str:
            return "a list" if not c.keyed else "named layers" if c.layer_ids else "a dict of other names"

        return (
            f"{k.attr} is {form(k)} but {v.attr} is {form(v)}: which V belongs to which K is unknown; "
            f"give both as lists in layer order, or both as dicts with the same layer names"
        )
    # two dicts without layer ids: only the same keys, in the same order, pair up
    if [key_text(n) for n in k.names or ()] != [key_text(n) for n in v.names or ()]:
        return (
            f"{k.attr} and {v.attr} are dicts whose names give no layer ids and differ (or differ in order): "
            f"which V belongs to which K is unknown; use the same keys in both, or names with one layer index"
        )
    return None


def locate_sequence(pool: Sequence[object]) -> tuple[list[Located], list[str]]:
    """A plain list/tuple: per-layer tensors, (k, v) pairs, [k_list, v_list], or [K_all, V_all].

    Where two of these readings fit the same object (two layers), both are returned, so the
    choice is an ambiguity settled by ``axes=`` (e.g. ``"L KV N H D"`` vs ``"KV L N H D"``).
    """
    L, KV = Axis.LAYER, Axis.KV
    pool = [plain(x) for x in cast(Sequence[object], plain(pool))]  # nested [k_list, v_list] too
    if pool and all(is_tensor_seq(x) for x in pool):
        found: list[Located] = []
        flat = [t for x in pool for t in x]  # type: ignore[attr-defined]
        if why := _storage_problem(SELF, flat):
            return [], [why]
        if len(pool) == 2:
            k, v = (Container(f"{SELF}[{i}]", tuple(pool[i]), True) for i in (0, 1))  # type: ignore[arg-type]
            found.append(Located("kv-pair-lists", (k, v), MHA, (KV, L)))
        if all(len(x) == 2 for x in pool):  # type: ignore[arg-type]
            k, v = (Container(f"{SELF}[*][{i}]", tuple(x[i] for x in pool), True) for i in (0, 1))  # type: ignore[index]
            found.append(Located("layer-pairs", (k, v), MHA, (L, KV)))
        if not found:
            return [], [f"{SELF} is a list of lists but neither a [K list, V list] pair nor a list of (K, V) pairs"]
        return found, []
    c = make_container(SELF, pool)
    if isinstance(c, str):
        return [], [c]
    found = [Located("sequence", (c,), BOTH, (L,))]
    if len(pool) == 2:
        k, v = (Container(f"{SELF}[{i}]", (c.tensors[i],), False) for i in (0, 1))
        found.append(Located("kv-pair-tensors", (k, v), MHA, (KV,)))
    return found, []


def is_tensor_seq(x: object) -> bool:
    x = plain(x)
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(t, torch.Tensor) for t in x)
