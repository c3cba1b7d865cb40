"""Merge: flushed generations of each region go into the base table with Lance merge-insert.

Per region, the generations above merged_generations[region] are merged in ascending order; several
consecutive ones may share one commit (bounded by a generation count and a byte budget), where per key
the highest generation wins and, within a generation, the later row. Upserts, tombstone deletes and
the merged_generations marker are one commit (`mark_sstables_as_compacted`), so progress can never
claim data that is not there. When a racing merger got there first, Lance refuses the stale marker;
we reload the MemWAL index and go on from what is really merged (memwal-spec.txt, Appendix 2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN, newest_per_key
from memwal.errors import CommitConflictError, MemWalError, MissingGenerationError
from memwal.faults import fault_point
from memwal.generation import open_generation
from memwal.lock import index_lock
from memwal.mem_wal_index import load_index
from memwal.region_manifest import canonical_region_id, load_latest_manifest, select_regions
from memwal.schema import primary_key_columns
from memwal.sql import keys_predicate
from memwal.storage import ObjectStore, lance_storage_options

__all__ = [
    "GenerationRef",
    "MergeConfig",
    "MergeInput",
    "MergeSummary",
    "RegionMergeResult",
    "local_dedup",
    "merge_region",
    "merge_table",
    "pending_generations",
    "plan_batch",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeConfig:
    max_generations_per_commit: int = 8
    max_bytes_per_commit: int = 512 * 1024 * 1024
    max_attempts: int = 20


@dataclass(frozen=True)
class GenerationRef:
    """One flushed generation to merge."""

    region_id: str
    generation: int
    path: str  # directory name relative to the region directory
    uri: str
    nbytes: int


@dataclass
class MergeInput:
    """What one commit applies: upserts and deleted keys.

    open_upserts() is called once per commit attempt; it returns a table when the upserts are in memory
    (Lance then plans the merge-insert join with exact statistics) or a stream when they are not.
    """

    open_upserts: Callable[[], pa.Table | pa.RecordBatchReader]
    deleted_keys: pa.Table
    rows_read: int = 0
    cleanup: Callable[[], None] = lambda: None


Dedup = Callable[[Sequence[GenerationRef], list[str], pa.Schema, ObjectStore], MergeInput]


@dataclass
class RegionMergeResult:
    region_id: str
    merged_generation_before: int = 0
    merged_generation_after: int = 0
    generations: list[int] = field(default_factory=list)
    rows_read: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    bytes_read: int = 0
    commits: int = 0
    conflicts: int = 0
    generations_merged_by_others: int = 0
    duration_s: float = 0.0
    error: str | None = None


@dataclass
class MergeSummary:
    table_uri: str
    table_version_before: int = 0
    table_version_after: int = 0
    regions: list[RegionMergeResult] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def commits(self) -> int:
        return sum(r.commits for r in self.regions)

    @property
    def failed_regions(self) -> list[str]:
        return [r.region_id for r in self.regions if r.error]

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            job="merge",
            commits=self.commits,
            generations_merged=sum(len(r.generations) for r in self.regions),
            rows_upserted=sum(r.rows_upserted for r in self.regions),
            rows_deleted=sum(r.rows_deleted for r in self.regions),
            bytes_read=sum(r.bytes_read for r in self.regions),
            failed_regions=self.failed_regions,
        )
        return out


def _generation_bytes(store: ObjectStore, region_id: str, path: str) -> int:
    return sum(m.size for m in store.list(f"{naming.generation_dir(region_id, path)}/data"))


def pending_generations(store: ObjectStore, region_id: str, merged_generation: int) -> list[GenerationRef]:
    """Flushed generations above merged_generation, ascending; they must be consecutive.

    merged_generation was read before the manifest: if a merge and a GC ran in between, the generations
    just above it are already merged and pruned from the manifest. That is a race, not a gap: the index is
    reloaded and the pending list starts from what is really merged. Only a generation still missing after
    the reload is refused.
    """
    manifest = load_latest_manifest(store, region_id)
    pending = sorted(
        (fg for fg in manifest.flushed_generations if fg.generation > merged_generation),
        key=lambda fg: fg.generation,
    )
    if pending and pending[0].generation > merged_generation + 1:
        reloaded = load_index(store.uri, store.storage_options).details.merged_generation(region_id)
        if reloaded > merged_generation:
            log.info("region %s: generations up to %d were merged meanwhile; continuing from there",
                     region_id, reloaded)
            return pending_generations(store, region_id, reloaded)
    expected = merged_generation + 1
    refs = []
    for fg in pending:
        if fg.generation != expected:
            raise MemWalError(
                f"region {region_id}: generation {expected} is not in the region manifest "
                f"(merged up to {merged_generation}, next listed {fg.generation}); refusing to skip it"
            )
        rel = naming.generation_dir(region_id, fg.path)
        refs.append(
            GenerationRef(region_id, fg.generation, fg.path, store.uri_of(rel),
                          _generation_bytes(store, region_id, fg.path))
        )
        expected += 1
    return refs


def plan_batch(pending: Sequence[GenerationRef], config: MergeConfig) -> list[GenerationRef]:
    """The first consecutive generations that fit one commit (always at least one)."""
    batch: list[GenerationRef] = []
    total = 0
    for ref in pending:
        if batch and (
            len(batch) >= config.max_generations_per_commit or total + ref.nbytes > config.max_bytes_per_commit
        ):
            break
        batch.append(ref)
        total += ref.nbytes
    return batch


def read_generation(ref: GenerationRef, store: ObjectStore) -> pa.Table:
    """A generation's rows with _tombstone, GEN_COLUMN and ROWADDR_COLUMN."""
    ds = open_generation(store, ref.region_id, ref.generation, ref.path)
    t = ds.to_table(with_row_address=True)
    t = t.append_column(GEN_COLUMN, pa.array([ref.generation] * t.num_rows, pa.int64()))
    return t.rename_columns([ROWADDR_COLUMN if c == "_rowaddr" else c for c in t.column_names])


def split_winners(winners: pa.Table, pk: list[str], schema: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """(upserts in the base schema, deleted keys) from the newest version of each key."""
    tomb = winners.column(naming.TOMBSTONE_COLUMN)
    upserts = winners.filter(pc.invert(tomb)).select(schema.names).cast(schema)
    deletes = winners.filter(tomb).select(pk)
    return upserts, deletes


def local_dedup(refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore) -> MergeInput:
    """In-process dedup with pyarrow (the library path; the Spark job supplies its own)."""
    tables = [read_generation(r, store) for r in refs]
    rows = pa.concat_tables(tables, promote_options="permissive")
    upserts, deletes = split_winners(newest_per_key(rows, pk), pk, schema)
    return MergeInput(lambda: upserts, deletes, rows.num_rows)


class _Counter:
    def __init__(self, reader: pa.RecordBatchReader):
        self.reader, self.rows = reader, 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self.reader:
            self.rows += batch.num_rows
            yield batch


def _is_stale_marker(exc: BaseException) -> bool:
    return "Stale SSTable compaction" in str(exc)


def _commit(uri: str, storage_options, region_id: str, last_gen: int, data: MergeInput, pk, schema) -> int:
    """One merge-insert commit of upserts + deletes + marker, under the MemWAL index lock; rows upserted."""
    with index_lock(ObjectStore(uri, storage_options)):
        return _commit_locked(uri, storage_options, region_id, last_gen, data, pk, schema)


def _commit_locked(uri: str, storage_options, region_id: str, last_gen: int, data: MergeInput, pk, schema) -> int:
    ds = lance.dataset(uri, storage_options=lance_storage_options(storage_options))
    builder = ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all()
    predicate = keys_predicate(data.deleted_keys, pk)
    if predicate:
        builder = builder.when_not_matched_by_source_delete(predicate)
    builder = builder.mark_sstables_as_compacted([CompactedSsTable(region_id, last_gen)])
    upserts = data.open_upserts()
    if isinstance(upserts, pa.Table):
        builder.execute(upserts)
        return upserts.num_rows
    counter = _Counter(upserts)
    builder.execute(pa.RecordBatchReader.from_batches(schema, iter(counter)))
    return counter.rows


def merge_region(
    uri: str,
    storage_options: dict[str, str] | None,
    region_id: str,
    config: MergeConfig | None = None,
    dedup: Dedup = local_dedup,
    up_to_generation: int | None = None,
) -> RegionMergeResult:
    """Merge the pending generations of one region (all, or up to a generation); safe to run
    concurrently with other mergers."""
    config = config or MergeConfig()
    region_id = canonical_region_id(region_id)
    store = ObjectStore(uri, storage_options)
    started = time.monotonic()
    result = RegionMergeResult(region_id)
    schema = lance.dataset(store.uri, storage_options=lance_storage_options(storage_options)).schema
    pk = primary_key_columns(schema, where=store.uri)
    first = True
    attempts = 0
    while True:
        merged = load_index(store.uri, storage_options).details.merged_generation(region_id)
        if first:
            result.merged_generation_before = merged
            first = False
        result.merged_generation_after = merged
        pending = pending_generations(store, region_id, merged)
        if up_to_generation is not None:
            pending = [r for r in pending if r.generation <= up_to_generation]
        batch = plan_batch(pending, config)
        if not batch:
            break
        data = dedup(batch, pk, schema, store)
        gens = [r.generation for r in batch]
        fault_point("merge.before_commit")
        try:
            upserted = _commit(store.uri, storage_options, region_id, gens[-1], data, pk, schema)
        except OSError as exc:
            attempts += 1
            result.conflicts += 1
            if attempts >= config.max_attempts:
                raise CommitConflictError(
                    f"region {region_id}: merge of generations {gens} failed {attempts} times: {exc}"
                ) from exc
            if _is_stale_marker(exc):
                log.info("region %s: generations up to %d were merged by another merger; reloading",
                         region_id, gens[-1])
            else:
                log.warning("region %s: merge commit of %s failed (%s); retrying", region_id, gens, exc)
            continue
        finally:
            data.cleanup()
        fault_point("merge.after_commit")
        result.generations += gens
        result.rows_read += data.rows_read
        result.rows_upserted += upserted
        result.rows_deleted += data.deleted_keys.num_rows
        result.bytes_read += sum(r.nbytes for r in batch)
        result.commits += 1
        result.merged_generation_after = gens[-1]
        log.info("region %s: merged generations %d..%d (%d upserts, %d deletes)",
                 region_id, gens[0], gens[-1], upserted, data.deleted_keys.num_rows)
    result.generations_merged_by_others = (
        result.merged_generation_after - result.merged_generation_before - len(result.generations)
    )
    result.duration_s = time.monotonic() - started
    return result


def merge_table(
    uri: str,
    storage_options: dict[str, str] | None = None,
    regions: Sequence[str] | None = None,
    config: MergeConfig | None = None,
    dedup: Dedup = local_dedup,
    up_to_generation: int | None = None,
) -> MergeSummary:
    """Merge all regions (or the given ones), each up to up_to_generation if given. A region that fails
    is reported, the others still run."""
    store = ObjectStore(uri, storage_options)
    started = time.monotonic()
    index = load_index(store.uri, storage_options)
    summary = MergeSummary(store.uri, table_version_before=index.table_version)
    for region_id, problem in select_regions(store, regions):
        if problem:
            summary.regions.append(RegionMergeResult(region_id, error=problem))
            continue
        try:
            summary.regions.append(
                merge_region(store.uri, storage_options, region_id, config, dedup, up_to_generation)
            )
        except (MemWalError, MissingGenerationError, OSError) as exc:
            log.error("region %s: merge failed: %s", region_id, exc)
            summary.regions.append(RegionMergeResult(region_id, error=str(exc)))
    summary.table_version_after = lance.dataset(
        store.uri, storage_options=lance_storage_options(storage_options)
    ).version
    summary.duration_s = time.monotonic() - started
    return summary
