"""Per-region status: what an operator (and the lag alerts) need to see.

For each region: writer epoch, current generation, flushed and merged generations, the unmerged backlog
(generations, rows, bytes), the age of the oldest unmerged generation, and index lag (merged generation
minus the generation each maintained index has caught up to; an index absent from index_catchup is
caught up, as the spec says, only if Lance shows it covering every live fragment: memwal.index_coverage).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import lance

from memwal import naming
from memwal.errors import MemWalError, one_line
from memwal.flush_failure import describe, read_flush_failure
from memwal.generation import open_generation
from memwal.index_coverage import with_coverage
from memwal.mem_wal_index import MemWalIndex
from memwal.region_manifest import load_latest_manifest
from memwal.storage import ObjectStore, lance_storage_options
from memwal.table import MemWalTable, TableLike

__all__ = [
    "RegionStatus",
    "TableStatus",
    "pending_work",
    "region_status",
    "table_status",
]


@dataclass
class RegionStatus:
    region_id: str
    region_spec_id: int = 0
    manifest_version: int = 0
    writer_epoch: int = 0
    current_generation: int = 0
    flushed_generations: list[int] = field(default_factory=list)
    merged_generation: int = 0
    unmerged_generations: int = 0
    unmerged_rows: int = 0
    unmerged_bytes: int = 0
    oldest_unmerged_age_s: float | None = None
    index_caught_up: dict[str, int] = field(default_factory=dict)
    index_lag_generations: int = 0
    flush_failure: str | None = None  # why the region's writer cannot flush (memwal.flush_failure), if it cannot
    error: str | None = None


@dataclass
class TableStatus:
    table_uri: str
    table_version: int
    generated_at: str
    regions: list[RegionStatus] = field(default_factory=list)
    maintained_indexes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            job="status",
            num_regions=len(self.regions),
            unmerged_generations=sum(r.unmerged_generations for r in self.regions),
            unmerged_rows=sum(r.unmerged_rows for r in self.regions),
            unmerged_bytes=sum(r.unmerged_bytes for r in self.regions),
            max_index_lag_generations=max((r.index_lag_generations for r in self.regions), default=0),
            oldest_unmerged_age_s=max(
                (r.oldest_unmerged_age_s for r in self.regions if r.oldest_unmerged_age_s is not None),
                default=None,
            ),
        )
        return out


def region_status(
    store: ObjectStore, index: MemWalIndex, region_id: str, indexes: Sequence[str], now: float | None = None
) -> RegionStatus:
    now = time.time() if now is None else now
    status = RegionStatus(region_id)
    try:
        m = load_latest_manifest(store, region_id)
    except MemWalError as exc:
        status.error = str(exc)
        return status
    merged = index.details.merged_generation(region_id)
    failure = read_flush_failure(store, region_id)
    if failure is not None:
        status.flush_failure = describe(failure, now)
    status.region_spec_id = m.region_spec_id
    status.manifest_version = m.version
    status.writer_epoch = m.writer_epoch
    status.current_generation = m.current_generation
    status.flushed_generations = sorted(fg.generation for fg in m.flushed_generations)
    status.merged_generation = merged
    for fg in m.flushed_generations:
        if fg.generation <= merged:
            continue
        status.unmerged_generations += 1
        files = store.list(naming.generation_dir(region_id, fg.path))
        if not files:
            status.error = f"generation {fg.generation} directory {fg.path} is missing"
            continue
        status.unmerged_bytes += sum(f.size for f in files if "/data/" in f.path)
        created = min(f.last_modified for f in files).timestamp()
        age = max(0.0, now - created)
        status.oldest_unmerged_age_s = max(status.oldest_unmerged_age_s or 0.0, age)
        try:
            status.unmerged_rows += lance.dataset(
                store.uri_of(naming.generation_dir(region_id, fg.path)),
                storage_options=lance_storage_options(store.storage_options),
            ).count_rows()
        except (OSError, ValueError) as exc:
            status.error = f"generation {fg.generation} at {fg.path} is unreadable: {exc}"
    for name in indexes:
        per_region = index.details.index_catchup.get(name)
        caught_up = merged if per_region is None else per_region.get(region_id, 0)
        status.index_caught_up[name] = caught_up
        status.index_lag_generations = max(status.index_lag_generations, merged - caught_up)
    return status


def table_status(table: TableLike, regions: Sequence[str] | None = None) -> TableStatus:
    """Status of every region (or the given ones), read in parallel, as of the handle's version."""
    table = MemWalTable.of(table)
    indexes = table.maintained_indexes()
    index = with_coverage(table.index, table.dataset, indexes)
    ids = list(regions) if regions is not None else table.regions()
    now = time.time()
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(lambda r: region_status(table.store, index, r, indexes, now), ids))
    return TableStatus(
        table_uri=table.uri,
        table_version=index.table_version,
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        regions=statuses,
        maintained_indexes=indexes,
    )


def pending_work(table: MemWalTable, regions: Sequence[str] | None = None,
                 up_to_generation: int | None = None) -> list[dict]:
    """What a merge would do now, per region with unmerged generations: region_id, merged_generation,
    generations (ascending), generation_bytes, rows, bytes; a region whose manifest cannot be read is
    listed with its error (its merge reports it)."""
    from memwal.merge import pending_generations

    index = table.index
    out = []
    for rid in list(regions) if regions else sorted(table.regions()):
        merged = index.details.merged_generation(rid)
        try:
            refs = pending_generations(table, rid, merged)
        except (MemWalError, OSError) as exc:
            out.append({"region_id": rid, "merged_generation": merged, "generations": [], "rows": 0,
                        "bytes": 0, "error": one_line(exc)})
            continue
        refs = [r for r in refs if up_to_generation is None or r.generation <= up_to_generation]
        if refs:
            out.append({"region_id": rid, "merged_generation": merged, "generations": [r.generation for r in refs],
                        "rows": sum(_rows(table.store, r) for r in refs), "bytes": sum(r.nbytes for r in refs),
                        "generation_bytes": [r.nbytes for r in refs]})
    return out


def _rows(store: ObjectStore, ref) -> int:
    """Rows of a pending generation (0 if it cannot be read: its merge reports why)."""
    try:
        return open_generation(store, ref.region_id, ref.generation, ref.path).count_rows()
    except (MemWalError, OSError, ValueError):
        return 0
