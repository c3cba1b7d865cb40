"""Table health beyond lag: what compaction, retention and GC keep bounded, and what holds GC back.

Fragments (and how many are small), the deleted-row ratio, table versions, bytes of the base table and of
`_mem_wal/` on storage, and what GC could free now with what limits it per region (a GC dry run). `memwal
status`, the lag monitor's gauges and thresholds (`memwal.lag`) and the MemWAL page all read this.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from memwal import naming
from memwal.compaction import fragment_health
from memwal.gc import gc_table
from memwal.job_config import GcConfig
from memwal.maintenance_config import CompactionConfig
from memwal.table import MemWalTable, TableLike

__all__ = ["TableHealth", "table_health"]


@dataclass
class TableHealth:
    fragments: int = 0
    small_fragments: int = 0
    physical_rows: int = 0
    deleted_rows: int = 0
    deleted_ratio: float = 0.0
    table_versions: int = 0
    oldest_table_version: int | None = None
    base_bytes: int = 0
    mem_wal_bytes: int = 0
    generation_dirs: int = 0
    gc_reclaimable_bytes: int = 0
    gc_reclaimable: dict[str, int] = field(default_factory=dict)
    gc_limited_by: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_health(table: TableLike,
                 target_rows_per_fragment: int = CompactionConfig.target_rows_per_fragment) -> TableHealth:
    """One reading of the table's health at its latest version (lists the table's objects once, and plans
    GC without deleting)."""
    table = MemWalTable.of(table)
    ds = table.refresh().dataset
    store = table.store
    frags = fragment_health(ds, target_rows_per_fragment)
    versions = sorted(int(v["version"]) for v in ds.versions())
    out = TableHealth(fragments=frags.fragments, small_fragments=frags.small_fragments,
                      physical_rows=frags.physical_rows, deleted_rows=frags.deleted_rows,
                      deleted_ratio=round(frags.deleted_ratio, 6), table_versions=len(versions),
                      oldest_table_version=versions[0] if versions else None)
    prefix = naming.MEM_WAL_DIR + "/"
    generations: set[str] = set()
    for meta in store.list(""):
        if meta.path.startswith(prefix):
            out.mem_wal_bytes += meta.size
            parts = meta.path.split("/")
            if len(parts) > 3 and naming.parse_generation_dir_name(parts[2]) is not None:
                generations.add("/".join(parts[:3]))
        else:
            out.base_bytes += meta.size
    out.generation_dirs = len(generations)
    plan = gc_table(table, config=GcConfig(dry_run=True)).to_dict()
    out.gc_reclaimable_bytes = plan["bytes"]
    out.gc_reclaimable = plan["would_delete"]
    out.gc_limited_by = {r["region_id"]: r["limited_by"] for r in plan["regions"] if r.get("limited_by")}
    return out
