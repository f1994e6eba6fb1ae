"""Cross-rank block-count agreement, before FlexKV sizes its tiers.

Ranks of one TP group must register identical layouts with the same number of GPU blocks, and
FlexKV MIN-reduces its CPU/SSD/remote block counts across ranks. Both functions here are
*collectives*: every rank of ``group`` must call them, in the same order. A rank that does not
arrive within ``timeout`` makes every other rank raise :class:`AlignmentError` instead of hanging
(on gloo groups, through ``monitored_barrier``; on other backends the group's own timeout applies).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .errors import AlignmentError
from .views import MHAView, PoolView

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


def _gather(payload: Any, group: Any, timeout: float, what: str) -> list[Any]:
    if not dist.is_available() or not dist.is_initialized():
        raise AlignmentError(f"{what} needs an initialised torch.distributed process group")
    rank = dist.get_rank(group)
    if dist.get_backend(group) == "gloo":
        try:
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout), wait_all_ranks=True)
        except RuntimeError as exc:
            raise AlignmentError(
                f"rank {rank}: not every rank reached {what} within {timeout:g}s; it is a collective that "
                f"every rank must call ({str(exc).splitlines()[0]})"
            ) from exc
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, payload, group=group)
    return gathered


def align_across_ranks(view: PoolView, group: Any = None, timeout: float = 60.0) -> PoolView:
    """Agree on one GPU block count (the minimum) and return this rank's view trimmed to it.

    First exchanges layout fingerprints: if any rank differs, every rank raises one
    :class:`AlignmentError` naming the ranks that disagree. Collective; see the module docstring.
    """
    mine = {"fingerprint": fingerprint(view), "num_blocks": view.num_blocks}
    everyone = _gather(mine, group, timeout, "align_across_ranks")
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


def align_block_counts(
    config: Any, group: Any = None, timeout: float = 60.0, names: tuple[str, ...] = FLEXKV_BLOCK_COUNTS
) -> dict[str, tuple[int | None, int | None]]:
    """MIN-align FlexKV's CPU/SSD/remote block counts on a config object or mapping, in place.

    Missing or ``None`` counts stay ``None`` only if they are ``None`` on every rank. Returns
    ``{name: (before, after)}``. Collective; see the module docstring.
    """

    def get(name: str) -> int | None:
        value = config.get(name) if isinstance(config, MutableMapping) else getattr(config, name, None)
        return None if value is None else int(value)

    mine = {name: get(name) for name in names}
    everyone = _gather(mine, group, timeout, "align_block_counts")
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
