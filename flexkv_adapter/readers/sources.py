"""Every input to :func:`~flexkv_adapter.adapt` becomes one :class:`Source` record before any reading.

A record says where the KV tensors are read from (``holder``: the pool, or a hybrid wrapper's
attention sub-pool), what is known about them (validated options, page size, and the spec or plugin
that supplied them), and whose they are (``pool``: the view's source and the hybrid policy's
subject). The steps that follow (readings and their ambiguity, metadata agreement through the one
integer reader, identity, extents, alignment, labels) then run the same way on every record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import AdapterError, InconsistentLayersError, NotAddressableError
from ..model.hybrid import HybridStructure
from .containers import addresses, plain, probe, probe_int
from .engine_objects import refuse_unproven
from .options import validate_options
from .plugins import plugin_spec
from .spec import load_spec, merge_spec_options
from .vllm_detect import is_vllm_dict
from .wrappers import check_kind, detect


@dataclass(frozen=True)
class Source:
    """One input, located: the tensors' holder, the known facts, and the owner."""

    pool: object
    holder: object
    options: dict[str, Any]
    page_size: int | None
    label: str | None = None  # "spec:<name>" or "plugin:<name>"
    mode: str | None = None  # the hybrid policy
    structure: HybridStructure | None = None  # a hybrid wrapper, unwrapped to its attention sub-pool
    vllm: bool = False  # a vLLM 0.33 cache dict: its geometry comes from strides (pipeline.adapting.adapt_vllm)


def locate_source(pool: object, page_size: int | None, given: dict[str, Any]) -> Source:
    """The record for ``pool``: spec and plugin options merged, unproven engine classes and remapped rows
    refused (:func:`.engine_objects.refuse_unproven`), hybrids unwrapped.

    Precedence: ``spec=``; explicit ``attrs=``/``axes=``; hybrid wrappers; recogniser plugins.
    Explicit attrs (an option or a spec's) name the tensors: read as named, never unwrapped.
    """
    given = dict(given)
    pool = plain(pool)  # a list or tuple subclass is read as what it holds, never through its own dunders
    mode, spec_source = given.pop("hybrid", None), given.pop("spec", None)
    label = None
    if spec_source is not None:
        spec = load_spec(spec_source)
        given, label = merge_spec_options(spec, given), f"spec:{spec.name}"
        page_size = _spec_page_size(spec.name, given.pop("page_size", None), page_size)
    refuse_unproven(pool, given.get("attrs") or ())  # engine classes by their table; remapped rows by markers
    if not given.get("axes") and not given.get("attrs") and is_vllm_dict(pool):
        if unused := sorted(set(given) - {"kind", "layer_ids"}):
            raise AdapterError(
                f"{unused} do not apply to a vLLM 0.33 dict, whose geometry comes from the views' strides; drop "
                f"them (only page_size=, kind= and layer_ids= apply), or pass axes= to read the tensors another way"
            )
        return Source(pool, pool, given, page_size, label, mode, vllm=True)
    structure = None if given.get("attrs") else detect(pool)
    if structure is not None:
        _check_same_sub_pool(pool, structure)
        check_wrapper_page_size(pool, structure)
        check_kind(pool, structure, given.get("kind"))
        given, page_size = _checked(given, page_size)
        return Source(pool, structure.primary, given, page_size, label, mode, structure)
    if spec_source is None and not given.get("attrs") and given.get("axes") is None:
        found = plugin_spec(pool)
        if found is not None:
            given, label = merge_spec_options(found[1], given), f"plugin:{found[0]}"
            page_size = _spec_page_size(found[1].name, given.pop("page_size", None), page_size)
            refuse_unproven(pool, given.get("attrs") or ())  # the objects the plugin's attrs= read through
    given, page_size = _checked(given, page_size)
    return Source(pool, pool, given, page_size, label, mode)


def _checked(given: dict[str, Any], page_size: int | None) -> tuple[dict[str, Any], int | None]:
    """The record's options and page size in their checked form: a spec's or plugin's fields pass the same
    rule as the caller's options (checked again, unchanged), last, as the geometry step used to check them."""
    checked = validate_options(given, page_size)
    return checked, checked.pop("page_size", None)


def _check_same_sub_pool(pool: object, structure: HybridStructure) -> None:
    """Identity for a wrapper's attention sub-pool: a second read must hold the same KV memory."""
    again = probe(pool, structure.primary_attr)
    if again is structure.primary:
        return
    for name in ("kv_buffer", "k_buffer", "v_buffer"):
        if addresses(probe(structure.primary, name)) != addresses(probe(again, name)):
            raise NotAddressableError(
                f"{type(pool).__name__}.{structure.primary_attr} gives a sub-pool whose {name} is new memory on "
                f"every read (a property that copies); a view of it would alias a temporary. Fix: expose the "
                f"wrapper's own sub-pool, or name its tensors with attrs=[...]"
            )


def check_wrapper_page_size(pool: object, structure: HybridStructure) -> None:
    """A wrapper's ``page_size`` describes its sub-pools' pages (SGLang sets both from one value): one that
    contradicts the attention sub-pool's is malformed metadata, not a choice to make silently."""
    outer, inner = probe_int(pool, "page_size"), probe_int(structure.primary, "page_size")
    if outer is not None and inner is not None and outer != inner:
        raise InconsistentLayersError(
            f"{type(pool).__name__}.page_size={outer} contradicts {structure.primary_attr}.page_size={inner}; "
            f"fix the pool metadata"
        )


def _spec_page_size(name: str, from_spec: int | None, argument: int | None) -> int | None:
    if from_spec is not None and argument is not None and from_spec != argument:
        raise AdapterError(f"page_size={argument} contradicts spec {name}: page_size={from_spec}")
    return argument if argument is not None else from_spec
