"""The base table's fragment health and when compaction is due: read from the manifest alone. A module below
compaction (memwal.compaction runs it), index segments (what blocks it) and health (what the page shows), so
that none of them imports another to ask.

When it is due (`due_reasons`): more fragments than `max_fragments`, at least `max_small_fragments`
fragments below half the target size, or a deleted-row ratio at or above `max_deleted_ratio`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import lance

from memwal.maintenance_config import CompactionConfig

__all__ = ["FragmentHealth", "due_reasons", "fragment_health", "is_small"]


@dataclass
class FragmentHealth:
    """The base table's fragments: how many, how many are small, and the share of deleted rows."""

    fragments: int = 0
    small_fragments: int = 0
    physical_rows: int = 0
    deleted_rows: int = 0

    @property
    def deleted_ratio(self) -> float:
        return self.deleted_rows / self.physical_rows if self.physical_rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "deleted_ratio": round(self.deleted_ratio, 6)}


def _deleted_rows(meta: Any) -> int:
    return (meta.deletion_file.num_deleted_rows or 0) if meta.deletion_file is not None else 0


def is_small(meta: Any, target_rows_per_fragment: int) -> bool:
    """Compaction's "small" fragment (from its manifest metadata): live rows under half the target."""
    return meta.physical_rows - _deleted_rows(meta) < target_rows_per_fragment // 2


def fragment_health(ds: lance.LanceDataset, target_rows_per_fragment: int) -> FragmentHealth:
    """Read from the manifest (no data file is opened)."""
    out = FragmentHealth()
    for frag in ds.get_fragments():
        meta = frag.metadata
        out.fragments += 1
        out.physical_rows += meta.physical_rows
        out.deleted_rows += _deleted_rows(meta)
        out.small_fragments += is_small(meta, target_rows_per_fragment)
    return out


def due_reasons(health: FragmentHealth, config: CompactionConfig) -> list[str]:
    """Why compaction is due (empty: not due)."""
    out = []
    if health.fragments > config.max_fragments:
        out.append(f"{health.fragments} fragments > {config.max_fragments}")
    if health.small_fragments >= config.max_small_fragments and health.fragments > 1:
        out.append(f"{health.small_fragments} small fragments >= {config.max_small_fragments}")
    if health.deleted_rows and health.deleted_ratio >= config.max_deleted_ratio:
        out.append(f"deleted-row ratio {health.deleted_ratio:.3f} >= {config.max_deleted_ratio}")
    return out
