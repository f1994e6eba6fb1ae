"""Derive FlexKV's ``KVCacheLayout`` fields and tensor order for a view or raw KV tensors.

FlexKV picks its addressing mode from the number of tensors it receives per GPU
(``csrc/tp_transfer_thread_group.cpp``; contract §1.4) and computes strides from the layout (its
tp worker probes 5-D per-layer tensors for kv/block strides; its layerwise and NIXL workers do not,
so a 5-D tensor must have the layout's strides: :mod:`.checks`):

=========  =========  ==============================================================
tensors    mode       address of (layer l, kv k, block b)
=========  =========  ==============================================================
2L         SGLANG     ``ptr[k*L + l] + b*block_stride`` (all K, then all V)
L          VLLM       ``ptr[l] + k*kv_stride + b*block_stride`` (MLA: k = 0 only)
1          TRTLLM     ``ptr[0] + b*block_stride + l*layer_stride + k*kv_stride``
=========  =========  ==============================================================

:func:`plan` chooses the mode, computes the strides FlexKV will use, and checks, for every layer
and K/V, that FlexKV's address of block b is where the source keeps block b and that each
block's ``[T, H, D]`` chunk is contiguous and aligned, and that ``num_kv_heads`` and the layer
count agree with FlexKV's ``ModelConfig`` (:mod:`.model`). Anything else raises before FlexKV
can misread it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from typing_extensions import Unpack

from ..errors import PlanError
from ..model.axes import format_axes, parse_axes
from ..model.layout import Geometry, Interpretation
from ..model.views import MHAView, PoolView
from ..pipeline.adapting import adapt_source, hybrid_markers, recognise
from ..pipeline.carve import Planes, check_consistent
from ..pipeline.metadata import layer_ids_of, resolve_geometry
from ..readers.containers import Located, own_class
from ..readers.options import AdaptOptions, check_keywords, validate_options
from ..readers.planes import carries_planes
from ..readers.sources import Source, locate_source
from ..readers.vllm_layout import is_vllm_dict
from ..text import short_repr
from .checks import admit_plan, check_chunks, check_five_d
from .groups import check_not_partial, plan_groups
from .model import (
    LayoutFacts,
    ModelFacts,
    check_layout,
    check_model_dtype,
    model_facts,
    positive_int,
    registered_kv_heads,
)
from .plan_types import AddressingMode, FlexKVPlan, LayoutType, sealed
from .vllm_plan import plan_vllm

# Per-layer paged readings registered as they are (FlexKV's vLLM path), and the block-first one.
_REGISTERED_AS_IS = {
    (True, parse_axes("KV P T H D")): (LayoutType.LAYERFIRST, AddressingMode.VLLM),
    (True, parse_axes("P KV T H D")): (LayoutType.LAYERBLOCK, AddressingMode.VLLM),
    (True, parse_axes("P T D")): (LayoutType.LAYERFIRST, AddressingMode.VLLM),
    (True, parse_axes("P T H D")): (LayoutType.LAYERFIRST, AddressingMode.VLLM),
    (False, parse_axes("P L KV T H D")): (LayoutType.BLOCKFIRST, AddressingMode.TRTLLM),
}


def _boundary(
    tp_size: object, total_kv_heads: object, model_dtype: object, model_config: object, options: dict[str, Any]
) -> tuple[int, int | None, torch.dtype | None, ModelFacts | None]:
    """Validate plan()'s own arguments once: (tp_size, total_kv_heads, model_dtype, model facts)."""
    if "replicated_kv_heads" in options:
        raise PlanError(
            "replicated_kv_heads was removed: replicated KV heads can be registered only against a ModelConfig "
            "whose num_kv_heads counts the replicas; pass it as model_config="
        )
    model = model_facts(model_config) if model_config is not None else None
    tp = positive_int(tp_size, "tp_size") if tp_size is not None else (model.tp_size if model else 1)
    if model is not None and tp != model.tp_size:
        raise PlanError(f"tp_size={tp} contradicts model_config.tp_size={model.tp_size}")
    total = positive_int(total_kv_heads, "total_kv_heads") if total_kv_heads is not None else None
    if model_dtype is not None and not isinstance(model_dtype, torch.dtype):
        raise PlanError(f"model_dtype must be a torch.dtype (e.g. torch.bfloat16), got {short_repr(model_dtype)}")
    if model is not None and model_dtype is not None and model_dtype != model.dtype:
        raise PlanError(f"model_dtype={model_dtype} contradicts model_config.dtype={model.dtype}")
    return tp, total, model_dtype, model


def _as_is(record: Source) -> tuple[Geometry, Located, Interpretation, Planes] | None:
    """The reading of raw paged tensors FlexKV registers as they are; None: plan adapt()'s view instead.

    A hybrid wrapper (also read through ``attrs=`` into a sub-pool: its mapping labels the layers), planes
    beside the KV (scales, an indexer), ``dtype=`` and ``attrs=`` into a sub-object always go through adapt():
    the hybrid policy, the labels, the element type and the planes are decided there, once, for adapt() and
    plan() alike.
    """
    if record.structure is not None or carries_planes(record.holder) or hybrid_markers(record.pool):
        return None
    # bytes read as another dtype, or tensors named inside a sub-object (whose planes adapt() finds): adapt()'s
    # reading, so that plan(x, **o) reads the bytes plan(adapt(x, **o)) reads
    if record.options.get("dtype") is not None or any("." in str(a) for a in record.options.get("attrs") or ()):
        return None
    geometry = resolve_geometry(record.holder, record.page_size, record.options)  # type: ignore[arg-type]
    located, interp, logical = recognise(record.holder, geometry, record.options, views=False)  # type: ignore[arg-type]
    if (interp.per_layer, interp.axes) not in _REGISTERED_AS_IS or (located.split and interp.per_layer):
        return None
    return geometry, located, interp, logical


__all__ = ["AddressingMode", "FlexKVPlan", "LayoutType", "plan"]


def plan(
    source: object,
    *,
    tp_size: int | None = None,
    model_config: object = None,
    total_kv_heads: int | None = None,
    model_dtype: torch.dtype | None = None,
    page_size: int | None = None,
    **options: Unpack[AdaptOptions],
) -> FlexKVPlan:
    """Plan FlexKV registration of an adapted view, or of raw KV tensors.

    A :class:`~flexkv_adapter.MHAView` registers 2L tensors (SGLANG mode), an
    :class:`~flexkv_adapter.MLAView` L tensors with ``kv_dim=1`` (VLLM mode). Raw per-layer paged
    tensors (vLLM ``[2, NB, BS, H, D]`` -> LAYERFIRST, ``[NB, 2, BS, H, D]`` -> LAYERBLOCK, MLA
    ``[NB, BS, D]``) register one tensor per layer (VLLM mode); one block-first tensor
    ``[NB, L, 2, BS, H, D]`` registers whole (TRTLLM mode). Any other source, and any hybrid wrapper or
    pool with planes beside its KV, goes through :func:`~flexkv_adapter.adapt`'s pipeline (one record, one
    hybrid policy): ``plan(pool, **o)`` is ``plan(adapt(pool, **o))``. A pool offloaded whole
    (``view.whole``: scale planes, the DSA indexer, MiniMax's index KV) also gets ``groups``, FlexKV
    layer groups (:mod:`.groups`).

    ``model_config`` is FlexKV's ``ModelConfig`` (or an object or mapping with ``num_layers``,
    ``num_kv_heads``, ``head_size``, ``dtype``, ``tp_size``, optionally ``use_mla``/``kv_dim``,
    ``pp_size``, ``num_layers_per_pp_stage``): FlexKV's CPU side uses it, so the layer count, head
    size, element size and ``num_kv_heads`` must agree with it. ``num_kv_heads`` is 1 when every
    rank holds the same KV (MLA, MQA) and per-rank heads x ``tp_size`` otherwise. Without a
    ``model_config``, ``total_kv_heads`` settles one KV head per rank with tp > 1 (1: MQA, tp:
    split). ``model_dtype`` (FlexKV's model dtype) must have the tensors' element size.

    Raises:
        PlanError: inconsistent TP/head/dtype/layer settings, or an invalid argument.
        AmbiguousLayoutError: one KV head per rank with tp > 1 and nothing saying MQA or split.
        NotAddressableError: FlexKV's address arithmetic would not land on the source's blocks.
        InconsistentLayersError: raw per-layer tensors that disagree in shape, dtype or device.
    """
    extra: dict[str, Any] = dict(options)
    tp, total, model_dtype, model = _boundary(tp_size, total_kv_heads, model_dtype, model_config, extra)
    check_keywords(set(options) - {"replicated_kv_heads"}, "plan")  # that one is refused with its own reason
    own_class(source, "plan(source)")
    if not isinstance(source, PoolView) and "axes" not in options and is_vllm_dict(source):
        if ignored := sorted(set(options) - {"kind"}):
            raise PlanError(f"a vLLM 0.33 cache dict takes kind= and page_size= only; {ignored} would be ignored")
        return plan_vllm(
            source,  # type: ignore[arg-type]
            kind=validate_options({"kind": options["kind"]})["kind"] if "kind" in options else None,
            block_size=page_size,
            tp_size=tp,
            total_kv_heads=total,
            model_config=model,
            model_dtype=model_dtype,
        )
    if not isinstance(source, PoolView):
        record = locate_source(source, validate_options({}, page_size).get("page_size"), validate_options(options))
        as_is = _as_is(record)
        if as_is is None:
            view = adapt_source(record)  # adapt()'s pipeline from here: one hybrid policy for both
            return plan(view, tp_size=tp, model_config=model, total_kv_heads=total, model_dtype=model_dtype)
        geometry, located, interp, logical = as_is
        check_consistent(logical, source, located.attrs)
        layout_type, mode = _REGISTERED_AS_IS[(interp.per_layer, interp.axes)]
        tensors = located.containers[0].tensors
        planes = list(logical.values())
        first = planes[0][0]  # [B, T, H, D]
        kind, layer_ids = interp.kind, tuple(layer_ids_of(source, located, len(planes[0]), geometry))
        chunks = dict(enumerate(planes))
        name = f"{type(source).__name__}.{'/'.join(located.attrs)} [{format_axes(interp.axes)}]"
    else:
        if options or page_size is not None:
            raise PlanError(f"{source!r} is already adapted; adapt options go to adapt(view.source, ...)")
        view = source
        check_not_partial(view)
        layout_type = LayoutType.LAYERFIRST
        mode = AddressingMode.SGLANG if isinstance(view, MHAView) else AddressingMode.VLLM
        tensors = tuple(view.tensors())
        kind, layer_ids = view.kind, tuple(view.layer_ids)
        if isinstance(view, MHAView):
            k0, v0 = view.k_buffer[0], view.v_buffer[0]
            if k0.shape[2] != v0.shape[2]:
                raise PlanError(
                    f"{view!r}: head_dim {k0.shape[2]} != v_head_dim {v0.shape[2]}; FlexKV takes head_size "
                    f"from the K tensors and uses it for V too, so V would be misread"
                )
        ps = view.page_size
        chunks = {
            kv: [t.view(t.shape[0] // ps, ps, *t.shape[1:]) for t in plane]
            for kv, plane in enumerate(
                [view.k_buffer, view.v_buffer] if isinstance(view, MHAView) else [view.kv_buffer]
            )
        }
        first = chunks[0][0]
        name = repr(view)
    dtype = first.dtype
    facts = LayoutFacts(kind, len(chunks[0]), first.shape[2], first.shape[3], dtype, 2 if kind == "mha" else 1)
    if model is not None:
        check_layout(facts, model, tp)
    check_model_dtype(model_dtype, dtype, name)
    result = FlexKVPlan(
        type=layout_type,
        mode=mode,
        num_layer=facts.num_layers,
        num_block=first.shape[0],
        tokens_per_block=first.shape[1],
        num_head=facts.heads_per_rank,
        head_size=facts.head_size,
        kv_dim=facts.kv_dim,
        num_kv_heads=registered_kv_heads(facts, tp, total=total, model=model),
        tensors=tuple(tensors),
        layer_ids=layer_ids,
        dtype=dtype,
        kind=kind,
    )
    expected_tensors = {
        AddressingMode.SGLANG: 2 * result.num_layer,
        AddressingMode.VLLM: result.num_layer,
        AddressingMode.TRTLLM: 1,
    }[mode]
    if len(result.tensors) != expected_tensors:
        raise PlanError(f"{name}: {mode.value} mode needs {expected_tensors} tensors, got {len(result.tensors)}")
    check_five_d(result, name)
    check_chunks(result, chunks, name, tp)
    if isinstance(source, PoolView) and source.whole is not None:
        return sealed(replace(result, groups=plan_groups(result, source, tp, name)))  # the gate, with group rules
    admit_plan(result, name)  # the gate, for the as-is path too
    return sealed(result)
