"""Declarative layout specs: describe a pool's KV tensors without code.

A :class:`LayoutSpec` is the written form of one reading of a pool: which attribute(s) hold the
tensors, what each axis means, the view kind, and any geometry to check. It is exactly what the
built-in recognisers try (an attribute family x a reading of the axes; see :func:`builtin_specs`),
so ``adapt(pool, spec=...)`` goes through the same locate -> fit -> carve path and produces the
same view. Specs load from YAML (``configs/layouts/`` ships one per known layout).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..config.problems import known_keys, problem
from ..config.strict import NonNegativeInt, PositiveInt
from ..config.yamlfile import read_yaml_mapping, shown
from ..errors import AdapterError
from ..model.axes import Axis, format_axes, parse_axes
from ..text import clip, short_repr

_AXIS_MEANING = {
    Axis.LAYER: "layer (one tensor holds every layer)",
    Axis.KV: "K/V pair (index 0 = K, 1 = V)",
    Axis.ROWS: "token rows (flat)",
    Axis.PAGE: "page / block",
    Axis.TOKEN: "token within a page (extent = page size)",
    Axis.HEAD: "KV head",
    Axis.DIM: "head dim (MLA: the latent + rope row)",
}

# read from the module dict: getattr(torch, name) may import a submodule (torch._inductor) on demand
_DTYPE_NAMES = frozenset(name for name, value in vars(torch).items() if isinstance(value, torch.dtype))


class LayoutSpec(BaseModel):
    """One pool layout, written down."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(max_length=200)
    description: str = ""
    kind: Literal["mha", "mla"] | None = None
    attrs: list[str] | None = Field(None, min_length=1, max_length=2)
    axes: str = Field(max_length=64)
    page_size: PositiveInt | None = None
    dtype: str | None = Field(None, max_length=64)
    layer_num: PositiveInt | None = None
    head_num: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    v_head_dim: PositiveInt | None = None
    kv_dim: PositiveInt | None = None
    start_layer: NonNegativeInt | None = None
    layer_ids: list[NonNegativeInt] | None = None

    @field_validator("attrs")
    @classmethod
    def _attribute_paths(cls, value: list[str] | None) -> list[str] | None:
        for path in value or ():
            if len(path) > 200 or not all(part.isidentifier() for part in path.split(".")):
                raise ValueError(f"{short_repr(path)} is not an attribute name or dotted path like cache.k_buffer")
        return value

    @field_validator("axes")
    @classmethod
    def _valid_axes(cls, value: str) -> str:
        return format_axes(parse_axes(value))

    @field_validator("dtype")
    @classmethod
    def _valid_dtype(cls, value: str | None) -> str | None:
        if value is not None and value.removeprefix("torch.") not in _DTYPE_NAMES:
            raise ValueError(f"{short_repr(value)} is not a torch dtype name (e.g. bfloat16, float8_e4m3fn, uint8)")
        return value.removeprefix("torch.") if value else value

    @property
    def parsed_axes(self) -> tuple[Axis, ...]:
        return parse_axes(self.axes)

    def to_options(self) -> dict[str, Any]:
        """The equivalent :func:`~flexkv_adapter.adapt` options."""
        fields = self.model_dump(exclude={"name", "description", "dtype"}, exclude_none=True)
        if self.dtype:
            fields["dtype"] = getattr(torch, self.dtype)
        return fields

    def addressability(self) -> tuple[bool, str]:
        """Whether per-layer flat ``[rows, heads, dim]`` views of this layout are FlexKV-addressable."""
        axes = self.parsed_axes
        rows_first = axes.index(Axis.ROWS if Axis.ROWS in axes else Axis.PAGE)
        rows_last = axes.index(Axis.ROWS if Axis.ROWS in axes else Axis.TOKEN)
        if Axis.HEAD in axes and axes.index(Axis.HEAD) < rows_last:
            return False, "head-major (HND): heads sit outside tokens; FlexKV cannot register it"
        if axes == parse_axes("P KV T H D"):
            return False, (
                "K/V interleaved per block: not addressable as flat K/V; plan() registers it whole "
                "(LAYERBLOCK, one tensor per layer)"
            )
        if axes == parse_axes("P L KV T H D"):
            return False, "block-first: not addressable as flat K/V; plan() registers it whole (BLOCKFIRST)"
        inner = [a for a in axes if a in (Axis.LAYER, Axis.KV) and axes.index(a) > rows_first]
        if inner:
            return False, f"the {format_axes(inner)} axis lies between consecutive rows: not addressable"
        return True, "addressable: per-layer views are C-contiguous [rows, heads, dim] (if the tensor is contiguous)"

    def describe(self) -> str:
        ok, verdict = self.addressability()
        outcome = "adapt() gives views" if ok else "adapt() refuses it (NotAddressableError)"
        lines = [f"spec {self.name}: {self.kind.upper() if self.kind else 'MHA or MLA'} layout: {outcome}"]
        if self.description:
            lines.append(f"  {self.description}")
        lines.append(f"  attrs: {'/'.join(self.attrs) if self.attrs else 'the pool object itself'}")
        lines.append(f"  axes [{self.axes}]:")
        lines += [f"    {a.value:>2}  {_AXIS_MEANING[a]}" for a in self.parsed_axes]
        geometry = {k: v for k, v in self.to_options().items() if k not in ("kind", "attrs", "axes")}
        if geometry:
            lines.append(f"  geometry: {geometry}")
        lines.append(f"  verdict: {verdict}")
        return "\n".join(lines)


def load_spec(source: LayoutSpec | Mapping[str, Any] | str | os.PathLike[str]) -> LayoutSpec:
    """A spec object, a dict, or the path of a YAML file -> validated :class:`LayoutSpec`.

    Anything else, and any problem with the file or its content, is an :class:`AdapterError`
    naming the file and the problem (user input in the message is truncated).
    """
    if isinstance(source, LayoutSpec):
        return source
    if isinstance(source, Mapping):
        where = "spec"
        try:
            data = dict(source)
        except Exception as exc:  # a hostile Mapping (from a plugin) must still give an AdapterError
            raise AdapterError(f"layout spec mapping cannot be read: {type(exc).__name__}: {clip(str(exc))}") from None
    elif isinstance(source, (str, os.PathLike)):
        path, data = read_yaml_mapping(source, AdapterError, "layout spec")
        where = shown(path)
        data.setdefault("name", path.stem)
    else:
        raise AdapterError(
            f"a layout spec is a LayoutSpec, a mapping or the path of a YAML file, "
            f"not {type(source).__name__}: {short_repr(source)}"
        )
    try:
        return LayoutSpec.model_validate(data)
    except ValidationError as exc:
        from_yaml = not isinstance(source, Mapping)
        raise AdapterError(f"invalid layout spec ({where}): {validation_problems(exc, from_yaml=from_yaml)}") from None


def validation_problems(exc: ValidationError, limit: int = 8, from_yaml: bool = False) -> str:
    """pydantic's errors as ``key=value: problem`` items (:func:`~flexkv_adapter.config.problems.problem`:
    did-you-mean, quoted YAML numbers), each value and the whole list bounded."""
    errors = exc.errors()
    items = [
        f"{'.'.join(clip(str(p), 60) for p in e['loc'])}"
        f"{'' if e['type'] == 'missing' else '=' + short_repr(e.get('input'))}: {problem(e, LayoutSpec, from_yaml)}"
        f"{' (did you mean attrs?)' if e['type'] == 'extra_forbidden' and e['loc'] == ('tensors',) else ''}"
        for e in errors[:limit]
    ]
    if len(errors) > limit:
        items.append(f"and {len(errors) - limit} more")
    items += [note] if (note := known_keys(errors, LayoutSpec)) else []
    return "; ".join(items)


def _comparable(value: Any) -> Any:
    """Lists and tuples compare by their items: attrs=("k",) agrees with a spec's [k]."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _axes_or_none(value: Any) -> tuple[Axis, ...] | None:
    try:
        return parse_axes(value)
    except (ValueError, TypeError, AttributeError):
        return None


def merge_spec_options(spec: LayoutSpec, options: Mapping[str, Any]) -> dict[str, Any]:
    """Spec fields plus explicit options; an option contradicting the spec is an error."""
    merged = spec.to_options()
    for key, value in options.items():
        if value is None:
            continue
        if key in merged and _comparable(merged[key]) != _comparable(value) and key != "axes":
            raise AdapterError(
                f"option {key}={short_repr(value)} contradicts spec {spec.name}: {key}={short_repr(merged[key])}"
            )
        if key == "axes" and _axes_or_none(value) != spec.parsed_axes:
            raise AdapterError(f"option axes={short_repr(value)} contradicts spec {spec.name}: axes={spec.axes!r}")
        merged[key] = value
    return merged


def builtin_specs() -> list[LayoutSpec]:
    """Every reading the built-in recognisers try, written as specs (docs, ``inspect``, tests)."""
    from .recognize import builtin_readings

    return [
        LayoutSpec(
            name=f"{family}:{'/'.join(attrs) or 'pool'}:{interp.axes_text}",
            kind=interp.kind,
            attrs=list(attrs) or None,
            axes=interp.axes_text,
        )
        for family, attrs, interp in builtin_readings()
    ]
