"""Index health per base-table index: type, segments, indexed and unindexed rows and fragments.

The figures are those of Lance's `ds.stats.index_stats(name)` (num_segments, num_indexed_rows, ...), read
from the manifest alone: segment coverage from `describe_indices()`, rows from each fragment's physical rows
minus its deletions. No index or data file is opened (index_stats opens every segment's index file), so
the lag monitor can read it on every check. `memwal status`, the lag thresholds (`max_index_segments`,
`max_unindexed_rows`, in `memwal.lag`) and the StatsD gauges read this.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import lance

from memwal import naming

__all__ = ["IndexHealth", "index_health"]


@dataclass
class IndexHealth:
    name: str
    index_type: str
    fields: list[str] = field(default_factory=list)
    segments: int = 0
    indexed_rows: int = 0
    unindexed_rows: int = 0
    indexed_fragments: int = 0
    unindexed_fragments: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def index_health(ds: lance.LanceDataset) -> list[IndexHealth]:
    """Every index of the table at ds's version (the MemWAL system index left out), by name."""
    rows = {}
    for frag in ds.get_fragments():
        meta = frag.metadata
        deleted = meta.deletion_file.num_deleted_rows if meta.deletion_file is not None else 0
        rows[frag.fragment_id] = meta.physical_rows - (deleted or 0)
    out = []
    for d in sorted(ds.describe_indices(), key=lambda d: d.name):
        if d.name == naming.MEM_WAL_INDEX_NAME:
            continue
        covered = {int(f) for seg in d.segments for f in seg.fragment_ids} & rows.keys()
        h = IndexHealth(d.name, str(d.index_type), list(d.field_names), segments=len(d.segments),
                        indexed_fragments=len(covered), unindexed_fragments=len(rows) - len(covered))
        h.indexed_rows = sum(rows[f] for f in covered)
        h.unindexed_rows = sum(n for f, n in rows.items() if f not in covered)
        out.append(h)
    return out
