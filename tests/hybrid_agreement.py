"""adapt() against plan() on one input: the outcomes compared, for the main suite and the SGLang tier alike."""

from __future__ import annotations

import logging
from typing import Any

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.errors import PlanError
from flexkv_adapter.flexkv import plan

Outcome = tuple[str, Any, str]  # ("ok", result, "") or ("refused", error class, message)


def tensors_key(ts: Any) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]:
    return tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride())) for t in ts)


def plan_key(p: Any) -> tuple[Any, ...]:
    """Everything FlexKV receives from a plan: layout, ids, dtype, tensors (by address) and layer groups."""
    groups = tuple((g.name, g.layer_indices, g.head_size, g.compress_ratio, tensors_key(g.tensors)) for g in p.groups)
    fields = tuple(sorted(p.layout_fields().items()))
    return (fields, p.layer_ids, p.dtype, p.kind, tensors_key(p.tensors), groups)


def outcome(call: Any) -> Outcome:
    try:
        return "ok", call(), ""
    except AdapterError as exc:
        return "refused", type(exc), str(exc)


def _key(o: Outcome) -> Any:
    return (o[0], plan_key(o[1]) if o[0] == "ok" else o[1])


def agreement(pool: Any, options: dict[str, Any]) -> tuple[Outcome, Outcome]:
    """(adapt's outcome, plan's), after checking plan(pool, **o) is plan(adapt(pool, **o)) exactly."""
    logging.disable(logging.WARNING)  # attention_only warns once per call; the outcome is what counts
    try:
        adapted = outcome(lambda: adapt(pool, **options))
        planned = outcome(lambda: plan(pool, **options))
        via_view = outcome(lambda: plan(adapted[1])) if adapted[0] == "ok" else adapted
    finally:
        logging.disable(logging.NOTSET)
    context = f"{options}: adapt {adapted[0]} {adapted[2][:300]} / plan {planned[0]} {planned[2][:300]}"
    if adapted[0] == "refused":
        assert planned[0] == "refused" and planned[1] is adapted[1], context
    else:
        assert _key(planned) == _key(via_view), context
    if planned[0] == "ok":
        view, p = adapted[1], planned[1]
        assert list(p.layer_ids) == list(view.layer_ids), context
        assert tensors_key(p.tensors) == tensors_key(view.tensors()), context
        assert all(type(i) is int for i in p.layer_ids), context
    return adapted, planned


def is_documented_asymmetry(adapted: Outcome, planned: Outcome, options: dict[str, Any]) -> bool:
    """adapt() accepts, plan() refuses: only a DSA pool's KV alone under hybrid='error' (docs/hybrids.md)."""
    return (
        adapted[0] == "ok"
        and planned[1] is PlanError
        and "holds the KV alone" in planned[2]
        and options.get("hybrid") == "error"
        and adapted[1].whole is None
        and not adapted[1].side_groups
    )
