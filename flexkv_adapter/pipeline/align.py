"""Cross-rank block-count agreement, before FlexKV sizes its tiers.

Ranks of one TP group must register identical layouts with the same number of GPU blocks, and
FlexKV MIN-reduces its CPU/SSD/remote block counts across ranks. Both functions here are
*collectives*: every rank of ``group`` must call them, in the same order. A rank that does not
arrive within ``timeout`` makes every other rank raise :class:`AlignmentError` instead of hanging
(on gloo groups, through ``monitored_barrier``; on other backends the group's own timeout applies).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..config.integers import LIMIT, bounded_integer
from ..config.strict import COLLECTIVE_MAX_S, read_seconds
from ..errors import AlignmentError
from ..model.views import MHAView, PoolView
from ..text import clip, short_repr

logger = logging.getLogger(__name__)

FLEXKV_BLOCK_COUNTS = ("num_cpu_blocks", "num_ssd_blocks", "num_remote_blocks")


def fingerprint(view: PoolView) -> dict[str, Any]:
    """The layout facts every rank of a TP group must share."""
    first = view.tensors()[0]
    return {
        "kind": view.kind,
        "layers": len(view.layer_ids),
        "heads": first.shape[1],
        "head_dim": first.shape[2],
        "v_head_dim": view.v_buffer[0].shape[2] if isinstance(view, MHAView) else None,
        "dtype": str(first.dtype),
        "page_size": view.page_size,
    }


MAX_TIMEOUT_S = COLLECTIVE_MAX_S


def _check_timeout(timeout: object, what: str) -> float:
    """Before any rank waits: a bad timeout is this rank's programming error (the others time out). The rule
    is the ``align_timeout_s`` setting's (:func:`~flexkv_adapter.config.strict.read_seconds`)."""
    return read_seconds(timeout, f"{what}: timeout", MAX_TIMEOUT_S, error=AlignmentError)


def _exchange(op: str, problem: str | None, data: Any, group: Any, timeout: float) -> list[Any]:
    """Every rank's ``data``, once every rank called the same ``op`` with valid input.

    Each rank sends what it called and what is wrong with its own input, so a programming error on
    one rank (wrong collective, a count of -1) is one :class:`AlignmentError` on every rank, not a
    ``KeyError`` on some and a hang on others.
    """
    what = op.split("(", 1)[0]
    if not dist.is_available() or not dist.is_initialized():
        raise AlignmentError(problem or f"{what} needs an initialised torch.distributed process group")
    try:
        rank, world, backend = dist.get_rank(group), dist.get_world_size(group), dist.get_backend(group)
    except (RuntimeError, ValueError, TypeError, AttributeError) as exc:
        raise AlignmentError(f"{what}: {short_repr(group)} is not a usable process group ({exc})") from exc
    if rank < 0:
        raise AlignmentError(f"{what}: this process is not a member of group {short_repr(group)}")
    try:
        if backend == "gloo":
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout), wait_all_ranks=True)
    except RuntimeError as exc:
        raise AlignmentError(
            f"rank {rank}: not every rank reached {what} within {timeout:g}s; it is a collective that "
            f"every rank must call ({str(exc).splitlines()[0]})"
        ) from exc
    gathered: list[Any] = [None] * world
    try:
        dist.all_gather_object(gathered, {"op": op, "problem": problem, "data": data}, group=group)
    except RuntimeError as exc:
        raise AlignmentError(f"rank {rank}: exchanging {what} data failed ({str(exc).splitlines()[0]})") from exc
    calls = [e.get("op") if isinstance(e, dict) else None for e in gathered]
    if len(set(calls)) > 1:
        listed = "; ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
        raise AlignmentError(
            f"rank {rank}: ranks called different collectives ({listed}); every rank must call the same "
            f"alignment, with the same names, in the same order"
        )
    problems = [(r, e["problem"]) for r, e in enumerate(gathered) if e["problem"]]
    if problems:
        listed = "; ".join(f"rank {r}: {p}" for r, p in problems)
        raise AlignmentError(f"rank {rank}: {what} refused on every rank, nothing was agreed ({listed})")
    return [e["data"] for e in gathered]


def align_across_ranks(view: PoolView, group: Any = None, timeout: float = 60.0) -> PoolView:
    """Agree on one GPU block count (the minimum) and return this rank's view trimmed to it.

    First exchanges layout fingerprints: if any rank differs, every rank raises one
    :class:`AlignmentError` naming the ranks that disagree. Collective; see the module docstring.
    """
    timeout = _check_timeout(timeout, "align_across_ranks")
    valid = isinstance(view, PoolView)
    problem = None if valid else f"align_across_ranks needs a view from adapt(), got {type(view).__name__}"
    mine = {"fingerprint": fingerprint(view), "num_blocks": view.num_blocks} if valid else None
    everyone = _exchange("align_across_ranks", problem, mine, group, timeout)
    reference = everyone[0]["fingerprint"]
    odd = [r for r, e in enumerate(everyone) if e["fingerprint"] != reference]
    if odd:
        details = "; ".join(f"rank {r}: {everyone[r]['fingerprint']}" for r in odd)
        raise AlignmentError(
            f"ranks {odd} disagree with rank 0 on the KV layout (rank 0: {reference}; {details}); "
            f"every rank of a TP group must register the same layout"
        )
    counts = [e["num_blocks"] for e in everyone]
    agreed = min(counts)
    if agreed == view.num_blocks:
        return view
    note = f"trimmed {view.num_blocks} -> {agreed} blocks to agree across {len(counts)} ranks (counts {counts})"
    logger.info("%s", note)
    return view.with_num_blocks(agreed, note)


def _read_counts(config: Any, names: tuple[str, ...]) -> tuple[dict[str, int | None], str | None]:
    """This rank's counts, or what is wrong with them (checked before any rank agrees on anything)."""
    if not isinstance(names, tuple) or not names or not all(isinstance(n, str) for n in names):
        return {}, f"names must be a non-empty tuple of attribute names, got {short_repr(names)}"
    if isinstance(config, Mapping) and not isinstance(config, MutableMapping):
        return {}, f"config {type(config).__name__} cannot be updated; pass a dict or a config object"
    counts: dict[str, int | None] = {}
    for name in names:
        try:
            value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        except Exception as exc:  # a config property that raises is this rank's problem to report
            return {}, f"reading {name} raised {type(exc).__name__}: {clip(str(exc), 100)}"
        if value is not None:
            try:  # the one integer rule, as adapt()'s options, plan() and the settings read theirs
                value = bounded_integer(value, name, 0, LIMIT, AlignmentError)
            except AlignmentError as exc:
                return {}, f"{name}={short_repr(value)} is not a block count ({exc})"
        if value is not None and not isinstance(config, Mapping):
            try:
                setattr(config, name, value)  # the same value: proves the agreed one can be written
            except Exception as exc:
                return {}, f"cannot set {name} on {type(config).__name__} ({type(exc).__name__}: {clip(str(exc), 100)})"
        counts[name] = value
    return counts, None


def align_block_counts(
    config: Any, group: Any = None, timeout: float = 60.0, names: tuple[str, ...] = FLEXKV_BLOCK_COUNTS
) -> dict[str, tuple[int | None, int | None]]:
    """MIN-align FlexKV's CPU/SSD/remote block counts on a config object or mapping, in place.

    Missing or ``None`` counts stay ``None`` only if they are ``None`` on every rank. A count that the
    integer rule refuses (``-1``, ``7.9``, ``True``, ``"8"``; see :mod:`.integers`) on any rank fails every
    rank before anything is written. Returns ``{name: (before, after)}``. Collective; see the module docstring.
    """
    timeout = _check_timeout(timeout, "align_block_counts")
    mine, problem = _read_counts(config, names)
    readable = isinstance(names, tuple) and all(isinstance(n, str) for n in names)
    op = f"align_block_counts({clip(','.join(names), 200) if readable else short_repr(names)})"
    everyone = _exchange(op, problem, mine, group, timeout)
    changes: dict[str, tuple[int | None, int | None]] = {}
    for name in names:
        values = [e[name] for e in everyone]
        if all(v is None for v in values):
            changes[name] = (None, None)
            continue
        if any(v is None for v in values):
            raise AlignmentError(f"{name} is set on some ranks and not on others: {values}")
        agreed = min(v for v in values if v is not None)
        changes[name] = (mine[name], agreed)
        if agreed != mine[name]:
            logger.info("block count MIN alignment '%s': %s -> %d", name, mine[name], agreed)
        if isinstance(config, MutableMapping):
            config[name] = agreed
        else:
            setattr(config, name, agreed)
    return changes


__all__ = ["align_across_ranks", "align_block_counts", "fingerprint"]
