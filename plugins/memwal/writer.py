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
from memwal.flush_failure import clear_flush_failure, record_flush_failure
from memwal.generation import write_generation
from memwal.generation_indexes import MaintainedIndex, maintained_index_specs
from memwal.mem_wal_index import MemWalIndex, index_of
from memwal.memtable import MemTable
from memwal.primary_key import primary_key_columns, refuse_null_keys
from memwal.region_manifest import FlushedGeneration, RegionManifest, canonical_region_id, load_latest_manifest
from memwal.region_rows import check_rows_in_region
from memwal.schema import conform_to, tombstone_schema, with_field_ids, with_tombstone
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


def _region_spec_id(index: MemWalIndex | None) -> int:
    """The newest region spec of the table (0, a manual region, when there is none)."""
    return index.details.newest_region_spec_id if index is not None else 0


def _maintained_indexes(base: lance.LanceDataset, index: MemWalIndex | None) -> list[MaintainedIndex]:
    """The indexes the MemWAL index says to maintain that exist on the base table (none before init)."""
    if index is None:
        return []
    details = index.details
    if details.maintained_indexes:
        names = list(details.maintained_indexes)
    elif details.maintain_all_indexes:
        names = [d.name for d in base.describe_indices()]
    else:
        names = []
    return maintained_index_specs(base, names)


def _field_ids(base: lance.LanceDataset) -> dict[str, int]:
    """Top-level column name -> Lance field id: WAL entries carry them (as Lance core's do), so replay matches
    a renamed column by id."""
    return {f.name(): f.id() for f in base.lance_schema.fields()}


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
        self.stats = WriterStats()
        self._closed = False
        self._flush_failure: dict | None = None
        self._base_version = -1
        self._field_ids: dict[str, int] = {}
        self._sync_base()
        if region_spec_id is None:
            region_spec_id = _region_spec_id(self._index)
        claimed = fencing.claim_region(self.store, self.region_id, region_spec_id)
        self.writer_epoch = claimed.writer_epoch
        self.manifest = claimed
        self.memtable = MemTable(claimed.current_generation, self._row_schema)
        self._next_position = max(claimed.replay_after_wal_entry_position + 1, wal.FIRST_POSITION)
        self._replay()
        log.info(
            "claimed region %s: epoch %d, generation %d, replayed %d WAL entries",
            self.region_id, self.writer_epoch, self.memtable.generation, self.stats.replayed_entries,
        )

    @property
    def mem_wal_index(self) -> MemWalIndex | None:
        """The table's MemWAL index as the writer last read it (None before the MemWAL is initialised)."""
        return self._index

    # -- the base table's schema and maintained indexes ---------------------------------------------

    def _sync_base(self) -> bool:
        """Re-read the schema and the maintained indexes if the base table moved; True if it did.

        Called at start, at every flush and when a put names a column the writer does not know: a column added
        (or renamed, or dropped) and an index added to or dropped from the maintained set reach a live writer.
        """
        base = lance.dataset(self.table_uri, storage_options=lance_storage_options(self.store.storage_options))
        if base.version == self._base_version:
            return False
        try:
            # configuration only (maintained indexes, region specs): no merge-progress floor to read
            self._index: MemWalIndex | None = index_of(base, self.store, monotone=False)
        except MemWalNotInitializedError:
            self._index = None
        old_ids = self._field_ids
        self.schema = base.schema
        self.pk_columns = primary_key_columns(self.schema, where=self.table_uri)
        self._field_ids = _field_ids(base)
        self._row_schema = tombstone_schema(self.schema)  # rows as the MemTable, WAL and generations hold them
        self._wal_schema = with_field_ids(self._row_schema, self._field_ids)
        self.maintained_indexes = _maintained_indexes(base, self._index)
        self._base_version = base.version
        memtable = getattr(self, "memtable", None)
        if memtable is not None and not memtable.schema.equals(self._row_schema):
            memtable.conform(self._row_schema, old_ids, self._field_ids)
        return True

    # -- WAL ---------------------------------------------------------------------------------------

    def _take_entry(self, entry: wal.WalEntry, replaying: bool = False) -> None:
        # While replaying, our own epoch is brand new: an entry already carrying it is another writer's.
        if entry.writer_epoch > self.writer_epoch or (replaying and entry.writer_epoch == self.writer_epoch):
            self._abort()
            raise FencedError(self.region_id, self.writer_epoch, entry.writer_epoch)
        rows = conform_to(entry.table, self.memtable.schema, self._field_ids)
        self.memtable.append(rows, entry.position)
        self._next_position = entry.position + 1

    def _replay(self) -> None:
        for entry in wal.scan_wal(self.store, self.region_id, self._next_position - 1):
            self._take_entry(entry, replaying=True)
            self.stats.replayed_entries += 1

    def _append(self, rows: pa.Table) -> None:
        self._check_open()
        data = wal.encode_wal_entry(pa.Table.from_arrays(rows.columns, schema=self._wal_schema),
                                    self.writer_epoch, self.memtable.generation)
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
        refuse_null_keys(table, self.pk_columns, self._where())
        self._check_columns(table)
        check_rows_in_region(self, table)  # a row of another region is refused before anything is written
        self._append(with_tombstone(table, self.schema, tombstone=False, where=self._where(),
                                    target=self._row_schema))
        self.stats.puts += 1

    def delete(self, keys: pa.Table | pa.RecordBatch) -> None:
        """Delete rows by primary key (other columns are ignored). Durable when it returns."""
        table = pa.Table.from_batches([keys]) if isinstance(keys, pa.RecordBatch) else keys
        missing = [c for c in self.pk_columns if c not in table.column_names]
        if missing:
            raise ValueError(f"delete on region {self.region_id} needs primary key column(s) {missing}")
        if table.num_rows == 0:
            return
        refuse_null_keys(table, self.pk_columns, self._where())
        self._append(with_tombstone(table.select(self.pk_columns), self.schema, tombstone=True, where=self._where(),
                                    target=self._row_schema))
        self.stats.deletes += 1

    def _where(self) -> str:
        return f"table {self.table_uri} region {self.region_id}"

    def _check_columns(self, table: pa.Table) -> None:
        """A put naming a column the writer does not know: the base may have gained it since; otherwise refuse
        (dropping the column silently would lose what the caller wrote)."""
        unknown = [c for c in table.column_names if c not in self.schema.names]
        if unknown and self._sync_base():
            unknown = [c for c in table.column_names if c not in self.schema.names]
        if unknown:
            raise ValueError(f"{self._where()}: column(s) {unknown} are not in the base table's schema "
                             f"{self.schema.names}")

    # -- flush -------------------------------------------------------------------------------------

    def _maybe_flush(self) -> None:
        c, m = self.config, self.memtable
        interval_due = c.max_flush_interval_s is not None and m.age_seconds() >= c.max_flush_interval_s
        if m.rows >= c.max_memtable_rows or m.nbytes >= c.max_memtable_bytes or interval_due:
            self.flush()

    def flush(self) -> FlushedGeneration | None:
        """Write the MemTable as the next generation and commit it to the region manifest.

        A flush that fails (other than by fencing) keeps the MemTable for the next attempt and records why in
        the region's flush-failure record (memwal.flush_failure), which status, the page and alerts show; the
        first flush that commits removes it.
        """
        self._check_open()
        if self.memtable.is_empty():
            return None
        try:
            flushed = self._flush()
        except FencedError:
            raise
        except Exception as exc:
            self._flush_failure = record_flush_failure(
                self.store, self.region_id, writer_epoch=self.writer_epoch, generation=self.memtable.generation,
                memtable_rows=self.memtable.rows, error=exc, previous=self._flush_failure)
            raise
        if self._flush_failure is not None or self.stats.generations_flushed == 1:
            clear_flush_failure(self.store, self.region_id)  # ours, or one a previous writer left
            self._flush_failure = None
        return flushed

    def _flush(self) -> FlushedGeneration:
        m = self.memtable
        started = time.monotonic()
        self._sync_base()
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
