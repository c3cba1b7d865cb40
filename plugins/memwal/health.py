"""Table health beyond lag: what compaction, retention and GC keep bounded, and what holds GC back.

Two readings, by what they cost:
- the manifest reading (`table_health(..., storage=False)`): what the latest manifest knows (fragments and
  how many are small against the table's compaction target, deleted rows, bytes of the data files) and the
  table versions from one listing of `_versions/`. A few requests whatever the table's size and history:
  the lag monitor takes it every run.
- the storage reading (`storage_health`): every object of the table listed (bytes of the base table and of
  `_mem_wal/`, generation directories) and a GC dry run (what GC could free, what limits it per region),
  which reads the manifest of every retained table version. Its cost grows with the table's files and
  versions: `memwal status` and the page take it on demand, the lag monitor at a slower cadence.
`storage_measured_at` says when the storage figures were taken (None: not part of this reading).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

import lance

from memwal import naming
from memwal.fragment_health import fragment_health
from memwal.gc import gc_table
from memwal.job_config import GcConfig
from memwal.maintenance_config import CompactionConfig
from memwal.mem_wal_index import U64_MAX
from memwal.storage import ObjectStore
from memwal.table import MemWalTable, TableLike

__all__ = ["STORAGE_KEYS", "StorageHealth", "TableHealth", "storage_health", "table_health", "table_versions"]

_MANIFEST_NAME = re.compile(r"^(\d+)\.manifest$")


@dataclass
class StorageHealth:
    """The storage reading: a listing of every object of the table and a GC dry run, taken at
    `storage_measured_at` (ISO-8601 UTC)."""

    base_bytes: int = 0
    mem_wal_bytes: int = 0
    generation_dirs: int = 0
    gc_reclaimable_bytes: int = 0
    gc_reclaimable: dict[str, int] = field(default_factory=dict)
    gc_limited_by: dict[str, str] = field(default_factory=dict)
    storage_measured_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


STORAGE_KEYS = tuple(f.name for f in fields(StorageHealth))


@dataclass
class TableHealth:
    """One health reading. The manifest fields are always there; the storage fields (STORAGE_KEYS) are None
    unless a storage reading was taken or added (`with_storage`)."""

    # the latest manifest
    fragments: int = 0
    small_fragments: int = 0
    target_rows_per_fragment: int = CompactionConfig.target_rows_per_fragment
    physical_rows: int = 0
    deleted_rows: int = 0
    deleted_ratio: float = 0.0
    data_bytes: int = 0
    # the `_versions/` listing
    table_versions: int = 0
    oldest_table_version: int | None = None
    # the storage reading (StorageHealth)
    base_bytes: int | None = None
    mem_wal_bytes: int | None = None
    generation_dirs: int | None = None
    gc_reclaimable_bytes: int | None = None
    gc_reclaimable: dict[str, int] | None = None
    gc_limited_by: dict[str, str] | None = None
    storage_measured_at: str | None = None

    def with_storage(self, reading: StorageHealth | Mapping[str, Any]) -> TableHealth:
        """This reading with the storage figures of `reading` (one taken now, or an earlier one kept)."""
        values = reading.to_dict() if isinstance(reading, StorageHealth) else reading
        for key in STORAGE_KEYS:
            setattr(self, key, values.get(key))
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_versions(store: ObjectStore) -> list[int]:
    """The table versions whose manifest is in `_versions/`, ascending, from one listing (no manifest is
    read; Lance's `versions()` reads each one). V2 names are u64::MAX - version, zero-padded to 20 digits
    (`memwal.mem_wal_index`); V1 names are the version."""
    out = []
    for meta in store.list_files("_versions"):
        match = _MANIFEST_NAME.match(meta.path.rsplit("/", 1)[-1])
        if match:
            digits = match.group(1)
            out.append(U64_MAX - int(digits) if len(digits) == 20 else int(digits))
    return sorted(out)


def _data_bytes(ds: lance.LanceDataset) -> int:
    """Bytes of the data files the version references, as its manifest records them (0 for a file written
    without its size)."""
    return sum(f.file_size_bytes or 0 for frag in ds.get_fragments() for f in frag.metadata.files)


def table_health(table: TableLike, target_rows_per_fragment: int | None = None, *, storage: bool = True,
                 refresh: bool = True) -> TableHealth:
    """One reading of the table's health at its latest version: the manifest reading, plus with storage=True
    the storage reading taken now (see the module docstring for what each costs).

    target_rows_per_fragment: the table's compaction target (small fragments hold under half of it);
    None: compaction's default. refresh=False reads the handle's version as is (a caller that just refreshed).
    """
    table = MemWalTable.of(table)
    ds = (table.refresh() if refresh else table).dataset
    target = target_rows_per_fragment or CompactionConfig.target_rows_per_fragment
    frags = fragment_health(ds, target)
    versions = table_versions(table.store)
    out = TableHealth(fragments=frags.fragments, small_fragments=frags.small_fragments,
                      target_rows_per_fragment=target, physical_rows=frags.physical_rows,
                      deleted_rows=frags.deleted_rows, deleted_ratio=round(frags.deleted_ratio, 6),
                      data_bytes=_data_bytes(ds), table_versions=len(versions),
                      oldest_table_version=versions[0] if versions else None)
    if storage:
        out.with_storage(storage_health(table))
    return out


def storage_health(table: TableLike) -> StorageHealth:
    """The storage reading now: lists every object of the table once and plans GC without deleting."""
    table = MemWalTable.of(table)
    store = table.store
    out = StorageHealth(storage_measured_at=datetime.now(UTC).isoformat(timespec="seconds"))
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
