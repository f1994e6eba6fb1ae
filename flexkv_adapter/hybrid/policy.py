"""What happens to a pool with state beside its KV: offloaded whole, refused by name, or attention-only.

One decision for every way in (:func:`~flexkv_adapter.adapt` and :func:`~flexkv_adapter.flexkv.plan` both
reach it through the adapt pipeline): planes that share the KV's page ids are offloaded whole as FlexKV
layer groups; state that does not is refused (:class:`HybridPoolError`) unless ``hybrid="attention_only"``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from ..errors import UnsupportedPoolError
from ..gate import admit
from ..model.hybrid import HybridMode, HybridPoolError, PartialPoolError, SideGroup, WholePool
from ..model.views import PoolView
from ..readers.planes import carried_planes, describe
from ..text import short_repr

logger = logging.getLogger(__name__)


def resolve_mode(mode: str | None) -> HybridMode:
    if mode is None:
        from ..config.settings import load_settings

        return load_settings().hybrid
    if mode not in ("error", "attention_only"):
        raise UnsupportedPoolError(f"hybrid must be 'error' or 'attention_only', got {short_repr(mode)}")
    return mode  # type: ignore[return-value]


def apply_policy(view: PoolView, pool: object, family: str, groups: Sequence[SideGroup], mode: str | None) -> PoolView:
    """Offload whole what FlexKV's layer groups can address; otherwise refuse (default) or go attention-only."""
    try:
        whole = describe(pool, view, admit)
    except PartialPoolError as exc:
        if not groups and mode == "error":  # DSA as before: FlexKV's connectors read the indexer themselves
            return _kv_alone(view, f"{', '.join(carried_planes(pool))} ({exc})")
        if not groups or resolve_mode(mode) != "attention_only":
            raise HybridPoolError(str(exc)) from exc
        whole = None  # a refused row: attention_only keeps its meaning
    covered = {t.data_ptr() for p in whole.planes for t in p.tensors} if whole is not None else set()
    if whole is not None and all(g.tensors and {t.data_ptr() for t in g.tensors} <= covered for g in groups):
        return _offload_whole(view, pool, whole, bool(groups), mode)
    if not groups:
        return view
    excluded = tuple((lid, f"{g.name}: {g.reason}") for g in groups for lid in g.layer_ids)
    described = "; ".join(g.describe() for g in groups)
    left_out = sorted({lid for g in groups for lid in g.layer_ids})
    name = type(pool).__name__
    if resolve_mode(mode) != "attention_only":
        raise HybridPoolError(
            f"{name} is a hybrid pool ({family}): FlexKV would receive only the attention layers "
            f"{list(view.layer_ids)}. Not offloaded: {described}. Layers {left_out} would be restored without "
            f"that state, so a prefix hit would compute on missing or stale data. To offload the attention "
            f"layers anyway, pass adapt(pool, hybrid='attention_only') or set FLEXKV_ADAPTER_HYBRID=attention_only."
        )
    logger.warning(
        "%s (%s): offloading attention layers %s only; not offloaded: %s", name, family, list(view.layer_ids), described
    )
    report = replace(
        view.report,
        source_kind=name,
        recognizer=f"{family}/{view.report.recognizer}",
        excluded_layers=excluded,
        side_groups=tuple(g.describe() for g in groups),
        warnings=(*view.report.warnings, f"attention layers only: {len(groups)} side group(s) not offloaded"),
    )
    return view.rebuild(source=pool, side_groups=tuple(groups), report=report)


def _offload_whole(view: PoolView, pool: object, whole: WholePool, listed: bool, mode: str | None) -> PoolView:
    """The only exact choice for these pools; ``hybrid=`` may only refuse it, naming why."""
    name, what = type(pool).__name__, ", ".join(p.name for p in whole.planes)
    if mode == "attention_only":
        raise HybridPoolError(
            f"{name} can be offloaded whole: {what} share the KV's page ids and register as FlexKV layer groups "
            f"(plan(view).flexkv_layer_groups()). hybrid='attention_only' would register the KV alone, and a "
            f"prefix hit would restore it without them. Drop hybrid= (offloading whole is the default)"
        )
    if mode == "error" and listed:  # asked for the KV alone (a caller that registers only the KV buffers)
        raise HybridPoolError(
            f"{name} ({whole.family}) keeps {what} beside its KV; hybrid='error' asks for the KV alone, which "
            f"would restore prefixes without them. Drop hybrid= to offload it whole through FlexKV's layer groups"
        )
    if mode == "error":  # DSA: FlexKV's connectors read the indexer from the pool themselves
        return _kv_alone(view, what)
    admit(repr(view), whole.groups(view), blocks=view.num_blocks, page=view.page_size)  # the group rules, no tp
    logger.info("%s: %s", name, whole.describe())
    report = replace(view.report, source_kind=name, notes=(*view.report.notes, whole.describe()))
    return view.rebuild(source=pool, whole=whole, report=report)


def _kv_alone(view: PoolView, left_out: str) -> PoolView:
    """hybrid="error" on a pool with planes: the KV alone, for a connector that reads the rest itself. Its
    report says so; plan() and register() refuse it (:func:`~flexkv_adapter.flexkv.groups.check_not_partial`)."""
    note = (
        f"hybrid='error': the KV alone; not included: {left_out}. FlexKV's SGLang connector reads that from the "
        f"pool itself; plan() and register() refuse this view"
    )
    return view.rebuild(report=replace(view.report, notes=(*view.report.notes, note)))


__all__ = ["apply_policy", "resolve_mode"]
