"""The one gate every tensor handed to FlexKV passes: KV, scales, indexer, index pool, as-is tensors.

FlexKV copies whatever pointers it is given, block by block, and checks nothing; a tensor that is
not memory, or memory that another registered tensor also holds, corrupts the cache silently. So
every path that produces tensors for FlexKV (:func:`~flexkv_adapter.pipeline.build.build_view` for the KV of
every source, :mod:`~flexkv_adapter.readers.planes` for each plane as it is read (handed this gate by the
hybrid policy), the hybrid policy for a whole view, and
:func:`~flexkv_adapter.flexkv.plan` for what it registers, the as-is path included, and
:func:`~flexkv_adapter.flexkv.vllm_plan.plan_form` for every vLLM 0.33 plan, the vLLM plugin's too, and
:func:`~flexkv_adapter.flexkv.vllm_indexer.check_indexer` for the indexer entries FlexKV's own split registers) calls
:func:`admit` with the groups it has. Its rules, in order (:data:`RULES`):

* ``tensor``: a real device, a live storage (not meta, fake, sparse, freed), at least one dimension
  and at least one row;
* ``read twice``: a group read from an attribute is read again and compared by storage, offset, shape
  and strides (:func:`~flexkv_adapter.readers.containers.same_memory`), never by object identity;
* ``count``: as many tensors as layers x tensors per layer (a K list then a V list: two);
* ``group``: when the registration is known (``blocks``), the group rules that need no tp: every group
  addressed with group 0's K/V planes (kv_dim), layers of the KV's stage only, a compress ratio that
  divides the page, rows that hold every block, chunk alignment and FlexKV's CPU-block packing;
* ``overlap``: no byte of a registered tensor is another registered tensor's, across all groups; one
  tensor registered twice with the same block size (shared layers, K and V one tensor) is the same
  memory, block for block, and only warned about.

Rules needing the tensor-parallel size stay in plan() (only it knows tp).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .errors import InconsistentLayersError, NotAddressableError, UnsupportedPoolError, describe
from .model.copy_rules import ALIGNMENT_FIX, alignment_problem, packing_problem, storage_problem
from .model.layer_group import Group
from .readers.containers import same_memory

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
RULES = ("tensor", "read twice", "count", "group", "overlap")
_EXACT_LIMIT = 1 << 18  # contiguous runs enumerated to prove two strided tensors disjoint


def admit(where: str, groups: Sequence[Group], *, blocks: int | None = None, page: int | None = None) -> list[str]:
    """Check ``groups`` by every rule of :data:`RULES`; the warnings (one tensor registered twice), or an
    :class:`~flexkv_adapter.errors.AdapterError` naming the group, the tensor and the rule."""
    storages: dict[tuple[object, int], int] = {}  # (storage address, device) -> bytes: asked once per storage
    spans: list[tuple[int, int, int, int]] = []
    for gi, group in enumerate(groups):
        for i, t in enumerate(group.tensors):  # the tensor rule; the common case inline (the hot path of adapt())
            if type(t) in _PLAIN and t.layout is _STRIDED and not t.is_meta and not t.is_nested and t.ndim:
                n, item, offset, start = t.numel(), t.element_size(), t.storage_offset(), t.data_ptr()
                key = (start - offset * item, t.get_device())
                if (size := storages.get(key)) is None:
                    size = storages[key] = t.untyped_storage().nbytes()
                if n and t.is_contiguous() and (offset + n) * item <= size:
                    spans.append((start, start + n * item, gi, i))
                    continue
            spans.append((*_tensor_rule(where, group, i, t), gi, i))
        if group.again is not None:
            _read_twice_rule(where, group)
        if group.layer_ids is not None and len(group.tensors) != len(group.layer_ids) * group.per_layer:
            _count_rule(where, group)
    if blocks is not None and page is not None:
        _group_rules(where, groups, blocks, page)
    return _overlap_rule(where, groups, spans) if len(spans) > 1 else []


def _tensor_rule(where: str, group: Group, i: int, t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` reaches, once it is real memory with a dimension and a row."""
    why = storage_problem(t)
    if why is None and t.ndim == 0:
        why = "is 0-d (a scalar), not rows of a block"
    if why is None and t.shape[0] == 0:
        why = "has 0 rows"
    if why:
        raise UnsupportedPoolError(
            f"{where}: {group.name}[{i}] {why}; FlexKV copies blocks of real memory, so every registered "
            f"tensor needs a real device, a live storage, at least one dimension and at least one row"
        )
    return _span(t)


def _read_twice_rule(where: str, group: Group) -> None:
    if group.again is None:
        return
    try:
        second = group.again()
    except Exception as exc:  # a getter that fails the second time gives no memory to register
        second = exc
    if not same_memory(group.tensors, second):
        raise NotAddressableError(
            f"{where}: {group.name} gives new memory on a second read (compared by storage, offset, shape and "
            f"strides): a property or getter that copies. Registering it would alias a temporary and FlexKV's "
            f"restores would never reach the pool. Fix: expose the pool's own tensors"
        )


def _count_rule(where: str, group: Group) -> None:
    if group.layer_ids is None:
        return
    wanted = len(group.layer_ids) * group.per_layer
    if len(group.tensors) != wanted:
        per = "K and V tensors" if group.per_layer == 2 else "tensors"
        raise InconsistentLayersError(
            f"{where}: {group.name} has {len(group.tensors)} tensors for {len(group.layer_ids)} layers "
            f"{list(group.layer_ids)}; FlexKV addresses a group as layers x {per} ({wanted}), so it would read "
            f"one layer's data from another's tensor and never copy the rest"
        )


def _group_rules(where: str, groups: Sequence[Group], blocks: int, page: int) -> None:
    primary = groups[0]
    stage = set(primary.layer_ids or ())
    for g in groups[1:]:
        name = f"{where}: {g.name}"
        if g.per_layer != primary.per_layer:
            raise NotAddressableError(
                f"{name}: {'K and V planes' if g.per_layer == 2 else 'one plane per layer'} under a KV with "
                f"kv_dim={primary.per_layer}; FlexKV addresses every group with group 0's kv_dim, so it would read "
                f"the wrong tensors"
            )
        if outside := sorted(set(g.layer_ids or ()) - stage):
            raise NotAddressableError(
                f"{name}: layers {outside} are not layers of the KV's pipeline stage {sorted(stage)}; FlexKV's "
                f"layer indices are local to the stage, so they would address no layer or another one"
            )
        if g.compress_ratio < 1 or page % g.compress_ratio:
            raise NotAddressableError(f"{name}: compress ratio {g.compress_ratio} does not divide the page ({page})")
    if len(primary.tensors) == 1 and any(len(g.tensors) > 1 for g in groups):  # FlexKV: 1 tensor = TRT-LLM
        raise NotAddressableError(
            f"{where}: a one-layer MLA KV (one tensor) makes FlexKV address every group as one block-first tensor"
        )
    for g in groups:
        chunk = g.chunk_bytes
        if chunk is None:
            continue
        for i, t in enumerate(g.tensors):
            row = t[0].numel() * t.element_size()
            if row * g.rows_per_block != chunk or t.shape[0] < blocks * g.rows_per_block:
                raise NotAddressableError(
                    f"{where}: {g.name}[{i}] ({describe(t)}) does not hold {blocks} blocks of {chunk} bytes "
                    f"({g.rows_per_block} rows of {row} bytes each), as FlexKV will read it"
                )
            if problem := alignment_problem(chunk, t.data_ptr()):
                raise NotAddressableError(f"{where}: {g.name}[{i}]: {problem}. {ALIGNMENT_FIX}")
    packed = [(g.name, len(g.layer_ids or ()), g.chunk_bytes) for g in groups if g.chunk_bytes is not None]
    if len(packed) > 1 and (problem := packing_problem(packed, primary.per_layer)):
        raise NotAddressableError(f"{where}: {problem}")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The first and one past the last byte a tensor reaches."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0)
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr(), a.shape, a.stride(), a.element_size()) == (
        b.data_ptr(),
        b.shape,
        b.stride(),
        b.element_size(),
    )


def _inner(t: torch.Tensor) -> tuple[int, list[tuple[int, int]]]:
    """The bytes of a tensor's innermost contiguous run, and the (size, stride) dims outside it."""
    item, inner, dims = t.element_size(), t.element_size(), list(zip(t.shape, t.stride()))
    while dims and (dims[-1][0] == 1 or dims[-1][1] * item == inner):
        size, _ = dims.pop()
        inner *= size
    return inner, dims


def _runs(t: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """Start offsets of a tensor's contiguous runs and their length in bytes; None if there are too many."""
    item = t.element_size()
    inner, dims = _inner(t)
    count = int(np.prod([n for n, _ in dims])) if dims else 1
    if count > _EXACT_LIMIT:
        return None
    starts = np.zeros(1, dtype=np.int64)
    for size, stride in dims:
        starts = (starts[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride * item).ravel()
    return starts + t.data_ptr(), inner


def _lattice_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Proven disjoint by arithmetic, at any size: equal geometry whose runs all start on one lattice of
    period ``p`` (every outer stride a multiple of the smallest), shifted by ``d`` with ``d mod p`` leaving
    room for a run on both sides (K and V interleaved block by block, as ``kv[:, 0]`` and ``kv[:, 1]``)."""
    if (a.shape, a.stride(), a.element_size()) != (b.shape, b.stride(), b.element_size()):
        return False
    inner, dims = _inner(a)
    outer = [stride * a.element_size() for size, stride in dims if size > 1]
    if not outer or min(outer) <= 0:
        return False
    period = min(outer)
    if any(stride % period for stride in outer):
        return False
    shift = abs(a.data_ptr() - b.data_ptr()) % period
    return shift >= inner and period - shift >= inner


def _bytes_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors whose spans overlap share a byte (exact for strided tensors, within a bound)."""
    if a.is_contiguous() and b.is_contiguous():
        return True
    if _lattice_apart(a, b):
        return False
    ra, rb = _runs(a), _runs(b)
    if ra is None or rb is None:
        return True  # too many runs to enumerate: not proven disjoint
    starts = np.concatenate([ra[0], rb[0]])
    ends = np.concatenate([ra[0] + ra[1], rb[0] + rb[1]])
    owner = np.concatenate([np.zeros(len(ra[0]), bool), np.ones(len(rb[0]), bool)])
    order = np.argsort(starts, kind="stable")
    starts, ends, owner = starts[order], ends[order], owner[order]
    for side in (False, True):  # a run starting before an earlier-starting run of the other tensor ends
        other_end = np.maximum.accumulate(np.where(owner != side, ends, 0))
        prior = np.concatenate([[0], other_end[:-1]])
        if np.any((owner == side) & (starts < prior)):
            return True
    return False


def _overlap_rule(where: str, groups: Sequence[Group], spans: list[tuple[int, int, int, int]]) -> list[str]:
    spans.sort()
    warnings = []
    count = len(spans)
    for n, (start, end, gi, i) in enumerate(spans):
        m = n + 1
        while m < count and spans[m][0] < end:
            other_start, _, gj, j = spans[m]
            m += 1
            t, u = groups[gi].tensors[i], groups[gj].tensors[j]
            if u.device != t.device:  # the same address on two devices is two memories
                continue
            name, other = f"{groups[gi].name}[{i}]", f"{groups[gj].name}[{j}]"
            if _same(t, u) and groups[gi].chunk_bytes == groups[gj].chunk_bytes:
                warnings.append(f"{name} overlaps {other}")
                continue
            if not _bytes_meet(t, u):
                continue
            row = t.stride(0) * t.element_size()
            raise InconsistentLayersError(
                f"{where}: {name} and {other} share bytes ({other_start - start} bytes apart, rows shifted against "
                f"each other or in another group): restoring a block of one would overwrite bytes of another "
                f"block, or of another plane, that FlexKV was never asked to touch (rows of {row} bytes). Tensors "
                f"may share bytes only as the same tensor within one group; expose each layer's own memory"
            )
    return warnings


__all__ = ["RULES", "Group", "admit"]
