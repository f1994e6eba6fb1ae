"""The objects :func:`~flexkv_adapter.adapt` returns: what FlexKV's connector reads.

FlexKV decides the pool kind with ``hasattr(kvcache, "kv_buffer")`` then
``hasattr(kvcache, "k_buffer")``. An :class:`MHAView` therefore never exposes ``kv_buffer`` and an
:class:`MLAView` never exposes ``k_buffer``/``v_buffer``, even if the source pool has them. Every
other attribute or method is forwarded to the source pool, so connector code that calls pool
methods (``get_key_buffer``, ``index_k_with_scale_buffer``, ...) keeps working, except the
attributes of :data:`HYBRID_ATTRIBUTES`: each of them switches FlexKV's connector (or adapt()
itself) onto a hybrid path that the view's buffers do not describe.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from .layout import ViewKind
from .report import Report

# Never forwarded from the source pool (flexkv_consumers.md §4): FlexKV's SGLang connector turns on
# SWA lookups for ``swa_kv_pool``/``translate_loc_from_full_to_swa`` and its DeepSeek-V4 path (which
# ignores ``kv_buffer``) for ``c4_kv_pool`` and its companions; the rest is what adapt() recognises
# as a hybrid wrapper (readers.wrappers.detect, and the markers its errors name).
HYBRID_ATTRIBUTES = frozenset(
    {
        "swa_kv_pool",
        "translate_loc_from_full_to_swa",
        "full_to_swa_index_mapping",
        "c4_kv_pool",
        "c128_kv_pool",
        "c4_indexer_kv_pool",
        "compress_state_pools",
        "indexer_compress_state_pools",
        "compression_ratios",
        "_unified_kv",
        "full_kv_pool",
        "layers_mapping",
        "full_attention_layer_id_mapping",
        "mamba_pool",
        "main_pool",
        "unified_kv_pool",
        "index_kv_pool",
        "index_k_pool",
        "index_kv_layer_id_mapping",
        "index_k_layer_id_mapping",
    }
)


class PoolView:
    """Zero-copy, block-aligned, FlexKV-ready view of a KV pool."""

    _hidden: ClassVar[frozenset[str]] = HYBRID_ATTRIBUTES
    kind: ClassVar[ViewKind]

    def __init__(
        self,
        source: object,
        layer_ids: list[int],
        page_size: int,
        num_blocks: int,
        dtype: torch.dtype,
        device: torch.device,
        report: Report,
        side_groups: tuple[Any, ...] = (),
        whole: Any = None,
    ) -> None:
        self.source = source
        self.side_groups = side_groups
        self.whole = whole  # model.hybrid.WholePool: the planes beside the KV, registered as FlexKV layer groups
        self.layer_ids = layer_ids
        self.page_size = page_size
        self.num_blocks = num_blocks
        self.dtype = dtype
        self.device = device
        self.report = report

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails. Guard against recursion before __init__ ran
        # (copy/pickle) and keep the kind decided by FlexKV's hasattr checks unambiguous.
        source = self.__dict__.get("source")
        if source is None or name in type(self)._hidden or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(source, name)

    def __repr__(self) -> str:
        r = self.report
        return (
            f"<{type(self).__name__} of {r.source_kind}: {len(self.layer_ids)} layers, "
            f"{self.num_blocks} blocks x {self.page_size} tokens, {self.dtype}>"
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every exposed tensor, in FlexKV's registration order."""
        raise NotImplementedError

    def _planes(self) -> dict[str, list[torch.Tensor]]:
        raise NotImplementedError

    def with_num_blocks(self, num_blocks: int, note: str) -> PoolView:
        """A new view of the first ``num_blocks`` blocks (slices: still zero-copy and contiguous)."""
        if not 1 <= num_blocks <= self.num_blocks:
            raise ValueError(f"num_blocks must be in 1..{self.num_blocks}, got {num_blocks}")
        rows = num_blocks * self.page_size
        report = replace(
            self.report,
            aligned_rows=rows,
            num_blocks=num_blocks,
            bytes_aliased=self.report.bytes_aliased * num_blocks // self.num_blocks,
            notes=(*self.report.notes, note),
        )
        planes = {name: [t[:rows] for t in ts] for name, ts in self._planes().items()}
        return self.rebuild(planes, num_blocks=num_blocks, report=report)

    def rebuild(self, planes: dict[str, list[torch.Tensor]] | None = None, **changes: Any) -> PoolView:
        """A view of the same kind with some fields (or the buffers) replaced."""
        fields: dict[str, Any] = dict(
            source=self.source,
            layer_ids=self.layer_ids,
            page_size=self.page_size,
            num_blocks=self.num_blocks,
            dtype=self.dtype,
            device=self.device,
            report=self.report,
            side_groups=self.side_groups,
            whole=self.whole,
        )
        fields.update(changes)
        cls: Any = type(self)
        view: PoolView = cls(**(planes or self._planes()), **fields)
        return view


class MHAView(PoolView):
    """MHA view: ``k_buffer[i]`` is ``[rows, heads, head_dim]``, ``v_buffer[i]`` ``[rows, heads, v_head_dim]``."""

    _hidden = HYBRID_ATTRIBUTES | {"kv_buffer"}
    kind = "mha"

    def __init__(self, k_buffer: list[torch.Tensor], v_buffer: list[torch.Tensor], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k_buffer = k_buffer
        self.v_buffer = v_buffer

    def tensors(self) -> list[torch.Tensor]:
        """All K tensors, then all V tensors (FlexKV's SGLang addressing mode)."""
        return [*self.k_buffer, *self.v_buffer]

    def _planes(self) -> dict[str, list[torch.Tensor]]:
        return {"k_buffer": self.k_buffer, "v_buffer": self.v_buffer}


class MLAView(PoolView):
    """MLA view: ``kv_buffer[i]`` is ``[rows, 1, kv_dim]`` holding K and V together."""

    _hidden = HYBRID_ATTRIBUTES | {"k_buffer", "v_buffer"}
    kind = "mla"

    def __init__(self, kv_buffer: list[torch.Tensor], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kv_buffer = kv_buffer

    def tensors(self) -> list[torch.Tensor]:
        return list(self.kv_buffer)

    def _planes(self) -> dict[str, list[torch.Tensor]]:
        return {"kv_buffer": self.kv_buffer}
