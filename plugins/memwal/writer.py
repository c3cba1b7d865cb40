"""The region writer: claim a region (epoch fencing), append WAL entries, flush generations.

A `put` or `delete` that returns is durable: its WAL entry was created with put-if-not-exists.
Recovery replays WAL entries after replay_after_wal_entry_position. If a WAL position is already taken,
the entry there is either an older (fenced) writer's, which is valid data and is absorbed into the
MemTable so nothing it acknowledged is lost, or a newer writer's, which means we are fenced and abort.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import lance
import pyarrow as pa

from memwal import fencing, naming, wal
from memwal.errors import (
    AlreadyExistsError,
    FencedError,
    MemWalError,
    MemWalNotInitializedError,
    WriterClosedError,
)
from memwal.faults import fault_point
from memwal.generation import write_generation
from memwal.generation_indexes import MaintainedIndex, maintained_index_specs
from memwal.memtable import MemTable
from memwal.primary_key import primary_key_columns
from memwal.region_manifest import FlushedGeneration, RegionManifest, canonical_region_id, load_latest_manifest
from memwal.schema import tombstone_schema, with_tombstone
from memwal.storage import ObjectStore, lance_storage_options

__all__ = ["RegionWriter", "WriterConfig", "WriterStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterConfig:
    """When a MemTable is flushed to a new generation: whichever threshold is reached first."""

    max_memtable_rows: int = 100_000
    max_memtable_bytes: int = 64 * 1024 * 1024
    max_flush_interval_s: float | None = 60.0


@dataclass
class WriterStats:
    puts: int = 0
    deletes: int = 0
    rows_written: int = 0
    wal_entries: int = 0
    wal_bytes: int = 0
    absorbed_entries: int = 0
    replayed_entries: int = 0
    generations_flushed: int = 0
    flush_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _current_region_spec_id(table_uri: str, storage_options: dict[str, str] | None) -> int:
    """The newest region spec of the table (0, a manual region, when there is none)."""
    from memwal.mem_wal_index import load_index

    try:
        return load_index(table_uri, storage_options).details.newest_region_spec_id
    except MemWalNotInitializedError:
        return 0


def _maintained_indexes(base: lance.LanceDataset, table_uri: str,
                        storage_options: dict[str, str] | None) -> list[MaintainedIndex]:
    """The indexes the MemWAL index says to maintain that exist on the base table (none before init)."""
    from memwal.mem_wal_index import load_index

    try:
        details = load_index(table_uri, storage_options).details
    except MemWalNotInitializedError:
        return []
    if details.maintained_indexes:
        names = list(details.maintained_indexes)
    elif details.maintain_all_indexes:
        names = [d.name for d in base.describe_indices()]
    else:
        names = []
    return maintained_index_specs(base, names)


class RegionWriter:
    """The single active writer of one region. Use as a context manager; close() flushes."""

    def __init__(
        self,
        table_uri: str,
        region_id: str,
        *,
        storage_options: dict[str, str] | None = None,
        config: WriterConfig | None = None,
        region_spec_id: int | None = None,
    ):
        self.region_id = canonical_region_id(region_id)
        self.store = ObjectStore(table_uri, storage_options)
        self.table_uri = self.store.uri
        self.config = config or WriterConfig()
        base = lance.dataset(self.table_uri, storage_options=lance_storage_options(storage_options))
        self.schema = base.schema
        self.pk_columns = primary_key_columns(self.schema, where=self.table_uri)
        self.maintained_indexes = _maintained_indexes(base, self.table_uri, storage_options)
        self.stats = WriterStats()
        self._closed = False
        if region_spec_id is None:
            region_spec_id = _current_region_spec_id(self.table_uri, storage_options)
        claimed = fencing.claim_region(self.store, self.region_id, region_spec_id)
        self.writer_epoch = claimed.writer_epoch
        self.manifest = claimed
        self.memtable = MemTable(claimed.current_generation, tombstone_schema(self.schema))
        self._next_position = max(claimed.replay_after_wal_entry_position + 1, wal.FIRST_POSITION)
        self._replay()
        log.info(
            "claimed region %s: epoch %d, generation %d, replayed %d WAL entries",
            self.region_id, self.writer_epoch, self.memtable.generation, self.stats.replayed_entries,
        )

    # -- WAL ---------------------------------------------------------------------------------------

    def _take_entry(self, entry: wal.WalEntry, replaying: bool = False) -> None:
        # While replaying, our own epoch is brand new: an entry already carrying it is another writer's.
        if entry.writer_epoch > self.writer_epoch or (replaying and entry.writer_epoch == self.writer_epoch):
            self._abort()
            raise FencedError(self.region_id, self.writer_epoch, entry.writer_epoch)
        self.memtable.append(entry.table.cast(self.memtable.schema), entry.position)
        self._next_position = entry.position + 1

    def _replay(self) -> None:
        for entry in wal.scan_wal(self.store, self.region_id, self._next_position - 1):
            self._take_entry(entry, replaying=True)
            self.stats.replayed_entries += 1

    def _append(self, rows: pa.Table) -> None:
        self._check_open()
        data = wal.encode_wal_entry(rows, self.writer_epoch, self.memtable.generation)
        while True:
            position = self._next_position
            try:
                wal.write_wal_entry(self.store, self.region_id, position, data)
                self._check_not_collected(position)
                fault_point("writer.after_wal_write")
                break
            except AlreadyExistsError:
                entry = wal.read_wal_entry(self.store, self.region_id, position)
                if entry is None:  # deleted between the two calls: only GC could, and it never should
                    raise MemWalError(f"WAL position {position} of region {self.region_id} vanished") from None
                self._take_entry(entry)  # raises FencedError for a newer writer's entry
                self.stats.absorbed_entries += 1
        self.memtable.append(rows, position)
        self._next_position = position + 1
        self.stats.wal_entries += 1
        self.stats.wal_bytes += len(data)
        self.stats.rows_written += rows.num_rows
        self._maybe_flush()

    def _check_not_collected(self, position: int) -> None:
        """Refuse a WAL entry written where replay will never look.

        A fenced writer whose successor flushed, was merged and garbage-collected can re-create a WAL
        position at or below the region's replay_after_wal_entry_position (GC removed the file that would
        have made the write collide). Position P-1 is gone only if GC passed it, so check the manifest then.
        """
        if position > wal.FIRST_POSITION and self.store.exists(naming.wal_entry_path(self.region_id, position - 1)):
            return
        latest = load_latest_manifest(self.store, self.region_id)
        if position <= latest.replay_after_wal_entry_position:
            self._abort()
            raise FencedError(self.region_id, self.writer_epoch, latest.writer_epoch)

    def put(self, data: pa.Table | pa.RecordBatch) -> None:
        """Upsert rows (all base-table columns). Durable when it returns."""
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        if table.num_rows == 0:
            return
        self._append(with_tombstone(table, self.schema, tombstone=False))
        self.stats.puts += 1

    def delete(self, keys: pa.Table | pa.RecordBatch) -> None:
        """Delete rows by primary key (other columns are ignored). Durable when it returns."""
        table = pa.Table.from_batches([keys]) if isinstance(keys, pa.RecordBatch) else keys
        missing = [c for c in self.pk_columns if c not in table.column_names]
        if missing:
            raise ValueError(f"delete on region {self.region_id} needs primary key column(s) {missing}")
        if table.num_rows == 0:
            return
        self._append(with_tombstone(table.select(self.pk_columns), self.schema, tombstone=True))
        self.stats.deletes += 1

    # -- flush -------------------------------------------------------------------------------------

    def _maybe_flush(self) -> None:
        c, m = self.config, self.memtable
        interval_due = c.max_flush_interval_s is not None and m.age_seconds() >= c.max_flush_interval_s
        if m.rows >= c.max_memtable_rows or m.nbytes >= c.max_memtable_bytes or interval_due:
            self.flush()

    def flush(self) -> FlushedGeneration | None:
        """Write the MemTable as the next generation and commit it to the region manifest."""
        self._check_open()
        m = self.memtable
        if m.is_empty():
            return None
        started = time.monotonic()
        latest = load_latest_manifest(self.store, self.region_id)
        if latest.writer_epoch > self.writer_epoch:  # checked before writing anything
            self._abort()
            raise FencedError(self.region_id, self.writer_epoch, latest.writer_epoch)
        rows, superseded = m.flush_rows(self.pk_columns)
        dir_name = write_generation(
            self.store, self.region_id, m.generation, rows, self.pk_columns, self.maintained_indexes, superseded,
        )
        flushed = FlushedGeneration(m.generation, dir_name)
        fault_point("writer.after_generation_write")

        def update(current: RegionManifest) -> RegionManifest:
            return current.next_version(
                current_generation=m.generation + 1,
                flushed_generations=(*current.flushed_generations, flushed),
                replay_after_wal_entry_position=m.last_position or 0,
                wal_entry_position_last_seen=max(current.wal_entry_position_last_seen, m.last_position or 0),
            )

        try:
            self.manifest = fencing.commit_as_writer(self.store, self.region_id, self.writer_epoch, update)
        except FencedError:
            log.warning("region %s: fenced during flush; %s is a failed-flush leftover", self.region_id, dir_name)
            self._abort()
            raise
        fault_point("writer.after_manifest_commit")
        self.memtable = MemTable(m.generation + 1, m.schema)
        self.stats.generations_flushed += 1
        self.stats.flush_seconds += time.monotonic() - started
        log.info("region %s: flushed generation %d (%d rows) to %s", self.region_id, m.generation, m.rows, dir_name)
        return flushed

    # -- lifecycle ---------------------------------------------------------------------------------

    def memtable_table(self) -> pa.Table:
        """The live MemTable's rows (with _tombstone), for strongly consistent LSM reads."""
        return self.memtable.to_table()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(f"writer of region {self.region_id} is closed")

    def _abort(self) -> None:
        self._closed = True

    def close(self) -> None:
        """Flush what is buffered and release the writer."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True

    def __enter__(self) -> RegionWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
