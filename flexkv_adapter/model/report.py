"""The frozen record of what :func:`~flexkv_adapter.adapt` did to a pool."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Report:
    """What matched, what is exposed, what was trimmed or excluded, and proof of zero-copy."""

    source_kind: str
    recognizer: str
    attributes: tuple[str, ...]
    reading: str
    kind: str
    layer_ids: tuple[int, ...]
    excluded_layers: tuple[tuple[int, str], ...]
    page_size: int
    rows: int
    aligned_rows: int
    num_blocks: int
    dtype: str
    device: str
    bytes_aliased: int
    bytes_copied: int
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    side_groups: tuple[str, ...] = ()

    @property
    def dropped_rows(self) -> int:
        return self.rows - self.aligned_rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (tuples become lists)."""
        data = asdict(self)
        data["dropped_rows"] = self.dropped_rows
        return {
            k: [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
            for k, v in data.items()
        }

    def __str__(self) -> str:
        ids = self.layer_ids
        span = f"{ids[0]}..{ids[-1]}" if ids and list(ids) == list(range(ids[0], ids[-1] + 1)) else str(list(ids))
        lines = [
            f"{self.source_kind} -> {self.kind.upper()} view via {self.recognizer} "
            f"({'/'.join(self.attributes)} read as {self.reading})",
            f"  layers: {len(ids)} (ids {span})",
            f"  rows: {self.rows} -> {self.aligned_rows} (dropped {self.dropped_rows}, "
            f"page_size {self.page_size}, {self.num_blocks} blocks per layer)",
            f"  dtype {self.dtype} on {self.device}; bytes aliased {self.bytes_aliased}, "
            f"bytes copied {self.bytes_copied}",
        ]
        lines += [f"  side group (not offloaded): {g}" for g in self.side_groups]
        if self.excluded_layers:
            lines.append(f"  excluded layers: {sorted({lid for lid, _ in self.excluded_layers})}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)
