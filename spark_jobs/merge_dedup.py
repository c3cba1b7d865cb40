"""The merge's parallel part on Spark: `spark_dedup(spark)` is a `memwal.merge.Dedup` hook with `.batch`.

The merge planner, the commits and the conflict handling stay in `memwal.merge`. For each planning round
it hands this hook every region batch (consecutive generations of one region bound for one commit) at
once, and gets back one `MergeInput` per batch:

1. driver: the region batches are dealt to tasks (largest first, round-robin), `spark.range(P, numPartitions=P)`
   gives exactly one row per task, and ONE `mapInArrow` job runs them all, in parallel across executors;
2. executor, per region batch: read its generations with pylance, keep the newest row per key
   (`memwal.merge.dedup_generations`: the same pyarrow code as the in-process merge, so no value ever
   crosses Spark's type system), write the upserts, already in the base schema, as Arrow IPC files under
   the round's staging prefix (`_mem_wal/_staging/merge-<uuid4>/u<batch>/part-*.arrow`, through
   `memwal.storage.ObjectStore`, so S3 works too), and the deleted keys as one more file beside them
   (`part-deleted-*.arrow`), and return only file names and counts; a small batch (`inline_bytes`) returns
   its upserts and deleted keys in the result (Arrow IPC blobs) instead of staging them (a commit that
   also carries a staged batch stages them beside it: `memwal.merge._Combined`). A batch that fails
   returns its error instead: only that region fails;
3. a region batch larger than `task_bytes` is spread over the cluster instead: one task per generation
   fragment, a window per key (`row_number()` over the primary key ordered by generation desc, row
   address desc: the rule of `memwal.dedup.newest_per_key`), and a second `mapInArrow` that stages the
   winners (upserts and deleted keys in files of their own); values cross Spark in a wider Spark type
   there (uint64 as DECIMAL(20,0), fixed-size lists as arrays) and are cast back on the executors; a cast
   that would lose data fails the batch.

The driver holds no more than one commit's upserts: `open_upserts()` reads the region batch's staged files
into one table when its commit is made (the commit's byte budget bounds it). The fragment apply
(`memwal.merge_apply`) does not open them: `MergeInput.staged` and `staged_deleted` name the files, its
tasks read them (on its lookup path the driver keeps their keys). A table, not a stream: with a
by-source delete, Lance's merge-insert over a stream held more memory the bigger the base table (measured:
its peak during the commit rose from 84 to 166 MiB over five 400,000-row commits into a table growing from
0.2 to 1.2 million rows; over a table, 75 to 64 MiB). It can be called again for a retried commit;
`cleanup()` deletes the batch's staging prefix (the library calls it after the commit attempt, or at the
end of the round); a failed Spark job cleans up before raising.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN
from memwal.errors import MemWalError
from memwal.generation import open_generation
from memwal.merge import Dedup, GenerationRef, MergeInput, dedup_generations, read_generation, split_winners
from memwal.planning import largest_first
from memwal.storage import ObjectStore
from spark_jobs.common import one_line, set_job_description, spark_error_line
from spark_jobs.task_runner import default_parallelism

__all__ = ["DEFAULT_TASK_BYTES", "STAGING_DIR", "spark_dedup", "warm_up"]

log = logging.getLogger(__name__)

STAGING_DIR = naming.STAGING_DIR
DEFAULT_FILE_BYTES = 64 * 1024 * 1024
MAX_FILE_BYTES = 1 << 30  # a staged file is one record batch: its string columns stay within 32-bit offsets
DEFAULT_TASK_BYTES = 256 * 1024 * 1024
DEFAULT_INLINE_BYTES = 1024 * 1024
INLINE_ROUND_BYTES = 64 * 1024 * 1024
_FILE = "__memwal_file"
_ROWS = "__memwal_rows"
_RANK = "__memwal_rank"


@dataclass(frozen=True)
class _Task:
    """One executor task: one fragment of one generation."""

    region_id: str
    generation: int
    path: str
    fragment_id: int


def spark_dedup(spark, *, file_bytes: int = DEFAULT_FILE_BYTES, task_bytes: int = DEFAULT_TASK_BYTES,
                inline_bytes: int = DEFAULT_INLINE_BYTES) -> Dedup:
    """A `memwal.merge.Dedup` that dedups on Spark and stages the upserts as Arrow IPC files.

    Called with one region batch it runs one Spark job for it; its `.batch` runs one job for a whole
    planning round. file_bytes: an executor starts a new staged file after about this many bytes.
    task_bytes: a region batch with more generation bytes than this is deduplicated by a shuffle across
    the cluster, not by one task.
    inline_bytes: a region batch with at most this many generation bytes (and at most file_bytes) returns
    its upserts in the job's result instead of staging them (INLINE_ROUND_BYTES per job at most): no
    object-store round trip for the many small batches of a many-region merge.
    """

    stats: dict = {}

    def batch(batches: Sequence[Sequence[GenerationRef]], pk: list[str], schema: pa.Schema,
              store: ObjectStore) -> list[MergeInput | Exception]:
        return _dedup_batches(spark, batches, pk, schema, store, file_bytes, task_bytes,
                              min(inline_bytes, file_bytes), stats)

    def dedup(refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore) -> MergeInput:
        result = batch([refs], pk, schema, store)[0]
        if isinstance(result, Exception):
            raise result
        return result

    dedup.batch = batch
    dedup.stats = stats  # jobs, tasks, job_s (driver wall), task_read_s / task_dedup_s / task_stage_s (summed)
    return dedup


def _warm(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import lance  # noqa: F401 - the imports are the point: a task's first import costs about a second

    import memwal.merge  # noqa: F401

    for _ in batches:
        pass
    return iter(())


def warm_up(spark) -> float:
    """Start the executors' Python workers (one task per core, importing pyarrow, lance and memwal) before
    the merge plans, so that the merge's own job does not pay for it. Seconds taken."""
    started = time.monotonic()
    n = _task_count(spark, 1 << 30)
    set_job_description(spark, "memwal merge: start the executors' Python workers")
    try:
        spark.range(0, n, 1, n).mapInArrow(_warm, _units_struct()).toArrow()  # the dedup job's own plan
    finally:
        set_job_description(spark, None)
    return time.monotonic() - started


# --- types across Spark -----------------------------------------------------------------------------


def _spark_type(t: pa.DataType):
    """The Spark type that carries an Arrow type without loss (cast back on the executors)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StructField,
        StructType,
    )

    wider = {pa.uint8(): ShortType(), pa.uint16(): IntegerType(), pa.uint32(): LongType(),
             pa.uint64(): DecimalType(20, 0), pa.float16(): FloatType()}
    if t in wider:
        return wider[t]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return ArrayType(_spark_type(t.value_type), containsNull=True)
    if pa.types.is_struct(t):
        return StructType([StructField(f.name, _spark_type(f.type), nullable=True) for f in t])
    if pa.types.is_map(t):
        return MapType(_spark_type(t.key_type), _spark_type(t.item_type), valueContainsNull=True)
    if pa.types.is_dictionary(t):
        return _spark_type(t.value_type)
    return from_arrow_type(t)


def _struct(fields: Sequence[tuple[str, object]]):
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, typ, nullable=True) for name, typ in fields])


def _arrow_schema(spark, struct) -> pa.Schema:
    """The exact Arrow schema Spark expects back from mapInArrow for this struct (Spark does not cast:
    an int64 column declared INT fails deep in the JVM)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false").lower() == "true"
    tz = spark.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(struct, timezone=tz, prefers_large_types=large)


def _rows_struct(schema: pa.Schema):
    from pyspark.sql.types import BooleanType, LongType

    fields = []
    for f in schema:
        if f.name == naming.TOMBSTONE_COLUMN:
            continue
        try:
            fields.append((f.name, _spark_type(f.type)))
        except Exception as exc:
            raise MemWalError(
                f"column {f.name!r} of type {f.type} cannot go through Spark ({exc}); use the local merge"
            ) from exc
    fields += [(naming.TOMBSTONE_COLUMN, BooleanType()), (GEN_COLUMN, LongType()), (ROWADDR_COLUMN, LongType())]
    return _struct(fields)


def _conform(batch: pa.RecordBatch, generation: int, target: pa.Schema) -> pa.RecordBatch:
    """A generation's batch (with `_rowaddr`) in the Spark-side row schema; missing columns are NULL."""
    n = batch.num_rows
    names = batch.schema.names
    columns = []
    for f in target:
        if f.name == GEN_COLUMN:
            columns.append(pa.array(np.full(n, generation, np.int64)))
        elif f.name == ROWADDR_COLUMN:
            columns.append(batch.column("_rowaddr").cast(pa.int64()))
        elif f.name in names:
            columns.append(batch.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=target)


# --- executor functions (closures are shipped by cloudpickle; they import memwal on the executor) ------


def _reader(tasks: list[_Task], uri: str, storage_options: dict, target: pa.Schema):
    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = ObjectStore(uri, storage_options)
        for ids in batches:
            for i in ids.column(0).to_pylist():
                task = tasks[i]
                ds = open_generation(store, task.region_id, task.generation, task.path)
                scanner = ds.scanner(fragments=[ds.get_fragment(task.fragment_id)], with_row_address=True)
                for batch in scanner.to_batches():
                    if batch.num_rows:
                        yield _conform(batch, task.generation, target)

    return read


class _StagedFiles:
    """Arrow IPC files of upserts, rolled over at about file_bytes, written with ObjectStore. Each file is one
    record batch: a reader's columns are then single arrays, zero-copy from a memory map (every scan task of
    the fragment apply reads each file's key column; Spark hands the writer batches of 10,000 rows, and a file
    of those made each task copy every key of the backlog)."""

    def __init__(self, store: ObjectStore, prefix: str, schema: pa.Schema, file_bytes: int, tag: str):
        self.store, self.prefix, self.schema, self.tag = store, prefix, schema, tag
        self.file_bytes = min(file_bytes, MAX_FILE_BYTES)
        self.written: list[tuple[str, int]] = []
        self._pending: list[pa.Table] = []
        self._bytes = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._bytes += table.nbytes
        if self._bytes >= self.file_bytes:
            self.finish()

    def finish(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        if table.nbytes <= MAX_FILE_BYTES:  # else (one caller's table alone that large) written as it came
            table = table.combine_chunks()
        self._pending, self._bytes = [], 0
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, self.schema) as writer:
            writer.write_table(table)
        path = f"{self.prefix}/part-{self.tag}-{len(self.written):04d}.arrow"
        self.store.put(path, sink.getvalue().to_pybytes())
        self.written.append((path, table.num_rows))


def _writer(uri: str, storage_options: dict, prefix: str, schema: pa.Schema, pk: list[str], out: pa.Schema,
            file_bytes: int):
    """Executor: the winners of one shuffle partition staged as files, upserts and deleted keys apart; one
    row per file (path, rows, and whether it holds deleted keys)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}" if ctx else uuid.uuid4().hex
        store = ObjectStore(uri, storage_options)
        staged = _StagedFiles(store, prefix, schema, file_bytes, tag)
        key_schema = pa.schema([schema.field(c) for c in pk])
        deleted = _StagedFiles(store, prefix, key_schema, file_bytes, f"deleted-{tag}")
        for batch in batches:
            upserts, deletes = split_winners(pa.Table.from_batches([batch]), pk, schema)
            staged.write(upserts)
            deleted.write(deletes.select(pk).cast(key_schema))
        staged.finish()
        deleted.finish()
        files = [(p, n, False) for p, n in staged.written] + [(p, n, True) for p, n in deleted.written]
        if files:
            paths, counts, kinds = zip(*files, strict=True)
            yield pa.RecordBatch.from_arrays([pa.array(paths, pa.string()), pa.array(counts, pa.int64()),
                                              pa.array(kinds, pa.bool_())], schema=out)

    return write


# --- driver -------------------------------------------------------------------------------------------


def _open_staged(store: ObjectStore, paths: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The staged upserts of one region batch as one table (files read one after another, zero-copy)."""
    tables = [pa.ipc.open_file(pa.py_buffer(store.get(path))).read_all() for path in paths]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _dedup_shuffle(spark, refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore,
           file_bytes: int) -> MergeInput:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, LongType, StringType

    started = time.monotonic()
    tasks: list[_Task] = []
    rows_read = 0
    for ref in refs:
        ds = open_generation(store, ref.region_id, ref.generation, ref.path)
        for fragment in ds.get_fragments():
            tasks.append(_Task(ref.region_id, ref.generation, ref.path, fragment.fragment_id))
            rows_read += fragment.count_rows()
    if not tasks:  # nothing planned, or only empty generations
        empty = schema.empty_table()
        return MergeInput(lambda: empty, empty.select(pk))
    region = refs[0].region_id
    gens = [r.generation for r in refs]

    rows_struct = _rows_struct(schema)
    rows_arrow = _arrow_schema(spark, rows_struct)
    out_struct = _struct([(_FILE, StringType()), (_ROWS, LongType()), (_IS_DELETED, BooleanType())])
    out_arrow = _arrow_schema(spark, out_struct)
    prefix = f"{STAGING_DIR}/merge-{uuid.uuid4()}"
    options = dict(store.storage_options)

    def col(name: str):
        return F.col("`" + name.replace("`", "``") + "`")

    newest = Window.partitionBy(*[col(c) for c in pk]).orderBy(col(GEN_COLUMN).desc(), col(ROWADDR_COLUMN).desc())
    set_job_description(spark, f"memwal merge: region {region} generations {gens[0]}..{gens[-1]}")
    try:
        rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(
            _reader(tasks, store.uri, options, rows_arrow), rows_struct
        )
        winners = rows.withColumn(_RANK, F.row_number().over(newest)).filter(col(_RANK) == 1).drop(_RANK)
        result = winners.mapInArrow(
            _writer(store.uri, options, prefix, schema, pk, out_arrow, file_bytes), out_struct
        ).toArrow()
        rows = sorted(zip(result.column(_FILE).to_pylist(), result.column(_ROWS).to_pylist(),
                          result.column(_IS_DELETED).to_pylist(), strict=True))
        files = [(p, n) for p, n, gone in rows if not gone]
        deleted_files = [(p, n) for p, n, gone in rows if gone]
    except BaseException as exc:
        _cleanup(store, prefix)
        if not isinstance(exc, Exception):
            raise
        raise MemWalError(
            f"region {region}: Spark dedup of generations {gens} failed: {spark_error_line(exc)}"
        ) from exc
    finally:
        set_job_description(spark, None)

    paths = [p for p, _ in files]
    deletes = sum(n for _, n in deleted_files)
    log.info(
        "region %s: Spark dedup of generations %d..%d: %d rows read from %d fragments, %d upserts staged in "
        "%d files and %d deletes in %d under %s (%.1fs)",
        region, gens[0], gens[-1], rows_read, len(tasks), sum(n for _, n in files), len(files), deletes,
        len(deleted_files), prefix, time.monotonic() - started,
    )
    return MergeInput(
        open_upserts=lambda: _open_staged(store, paths, schema),
        deleted_keys=pa.schema([schema.field(c) for c in pk]).empty_table(),
        rows_read=rows_read,
        cleanup=lambda: _cleanup(store, prefix),
        staged=tuple(paths),
        staged_rows=sum(n for _, n in files),
        staged_deleted=tuple(p for p, _ in deleted_files),
        staged_deleted_rows=deletes,
    )


# --- one task per region batch -----------------------------------------------------------------------

_UNIT = "__memwal_unit"
_READ = "__memwal_rows_read"
_DELETED = "__memwal_deleted"
_DELETED_ROWS = "__memwal_deleted_rows"  # deleted keys a staged batch staged (its files' rows add up to it)
_IS_DELETED = "__memwal_is_deleted"  # a staged file holds deleted keys (else upserts)
_UPSERTS = "__memwal_upserts"
_ERROR = "__memwal_error"


_TIMES = ("read_s", "dedup_s", "stage_s")


def _units_struct():
    from pyspark.sql.types import BinaryType, BooleanType, DoubleType, LongType, StringType

    return _struct([(_UNIT, LongType()), (_FILE, StringType()), (_ROWS, LongType()), (_READ, LongType()),
                    (_IS_DELETED, BooleanType()), (_DELETED, BinaryType()), (_DELETED_ROWS, LongType()),
                    (_UPSERTS, BinaryType()), (_ERROR, StringType())]
                   + [(t, DoubleType()) for t in _TIMES])


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _unit_prefix(prefix: str, unit: int) -> str:
    return f"{prefix}/u{unit:05d}"


def _unit_runner(units: list[list[GenerationRef]], bins: list[list[int]], inline: list[bool], uri: str,
                 storage_options: dict, prefix: str, pk: list[str], schema: pa.Schema, out: pa.Schema,
                 file_bytes: int, batch_rows: int):
    """Executor: the region batches of one task, each read, deduplicated and staged (or returned inline)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = f"{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}" if ctx else uuid.uuid4().hex
        store = ObjectStore(uri, storage_options)

        results: list[dict] = []  # one Arrow batch per task at the end: each batch costs a round trip

        def row(unit, file=None, rows=0, read=0, deleted=None, error=None, times=(0.0, 0.0, 0.0), upserts=None,
                is_deleted=False, deleted_rows=0):
            results.append({_UNIT: unit, _FILE: file, _ROWS: rows, _READ: read, _IS_DELETED: is_deleted,
                            _DELETED: deleted, _DELETED_ROWS: deleted_rows,
                            _UPSERTS: upserts, _ERROR: error, **dict(zip(_TIMES, times, strict=True))})

        for ids in batches:
            for b in ids.column(0).to_pylist():
                for unit in bins[b]:
                    refs = units[unit]
                    try:
                        t0 = time.perf_counter()
                        tables = [read_generation(r, store) for r in refs]
                        t1 = time.perf_counter()
                        upserts, deletes, n = dedup_generations(tables, pk, schema)
                        del tables
                        t2 = time.perf_counter()
                        staged = _StagedFiles(store, _unit_prefix(prefix, unit), schema, file_bytes, attempt)
                        keys = _StagedFiles(store, _unit_prefix(prefix, unit), deletes.schema, file_bytes,
                                            f"deleted-{attempt}")
                        if inline[unit]:
                            blob = _ipc_bytes(upserts) if upserts.num_rows else None
                        else:
                            blob = None
                            for chunk in upserts.to_batches(max_chunksize=batch_rows):
                                staged.write(pa.Table.from_batches([chunk], schema))
                            staged.finish()
                            keys.write(deletes)  # staged too: the driver gets paths and counts
                            keys.finish()
                        times = (t1 - t0, t2 - t1, time.perf_counter() - t2)
                    except Exception as exc:  # reported as this region's failure; the other batches go on
                        row(unit, error=one_line(exc))
                        continue
                    for path, rows in staged.written:
                        row(unit, file=path, rows=rows)
                    for path, rows in keys.written:
                        row(unit, file=path, rows=rows, is_deleted=True)
                    row(unit, rows=upserts.num_rows, read=n, times=times, upserts=blob,
                        deleted=_ipc_bytes(deletes) if inline[unit] and deletes.num_rows else None,
                        deleted_rows=0 if inline[unit] else deletes.num_rows)
        if results:
            yield pa.RecordBatch.from_pylist(results, schema=out)

    return run


class _RoundStaging:
    """The staging prefix of one batch job: each unit's files go when the unit is done, the prefix (with
    anything a failed task attempt left) when the last one is."""

    def __init__(self, store: ObjectStore, prefix: str, units: int):
        self.store, self.prefix, self.left = store, prefix, set(range(units))

    def done(self, unit: int, staged: bool = True) -> None:
        if unit not in self.left:
            return
        self.left.discard(unit)
        if not self.left:
            _cleanup(self.store, self.prefix)
        elif staged:
            _cleanup(self.store, _unit_prefix(self.prefix, unit))


def _deal(units: Sequence[Sequence[GenerationRef]], tasks: int) -> list[list[int]]:
    """Units dealt to tasks, largest first, each to the task with the fewest bytes so far."""
    return largest_first([sum(r.nbytes for r in unit) for unit in units], tasks)


def _task_count(spark, n_units: int) -> int:
    """One task per core: the deal balances the bytes, and on a small round every extra wave of tasks costs
    more in Spark's task overhead (about 0.1 s a wave, measured) than it could balance."""
    return max(1, min(n_units, default_parallelism(spark)))


def _dedup_batches(spark, batches: Sequence[Sequence[GenerationRef]], pk: list[str], schema: pa.Schema,
                   store: ObjectStore, file_bytes: int, task_bytes: int, inline_bytes: int,
                   stats: dict) -> list[MergeInput | Exception]:
    """One MergeInput (or the batch's error) per region batch: small ones in one job, large ones by shuffle."""
    out: list[MergeInput | Exception | None] = [None] * len(batches)
    small = [i for i, refs in enumerate(batches) if sum(r.nbytes for r in refs) <= task_bytes]
    for i, refs in enumerate(batches):
        if i not in small:
            try:
                out[i] = _dedup_shuffle(spark, refs, pk, schema, store, file_bytes)
            except MemWalError as exc:
                out[i] = exc
    if small:
        for i, result in zip(small, _dedup_units(spark, [list(batches[i]) for i in small], pk, schema, store,
                                                 file_bytes, inline_bytes, stats), strict=True):
            out[i] = result
    return out


def _dedup_units(spark, units: list[list[GenerationRef]], pk: list[str], schema: pa.Schema, store: ObjectStore,
                 file_bytes: int, inline_bytes: int, stats: dict) -> list[MergeInput | Exception]:
    started = time.monotonic()
    inline, inline_total = [], 0
    for refs in units:
        size = sum(r.nbytes for r in refs)
        inline.append(size <= inline_bytes and inline_total + size <= INLINE_ROUND_BYTES)
        inline_total += size if inline[-1] else 0
    prefix = f"{STAGING_DIR}/merge-{uuid.uuid4()}"
    options = dict(store.storage_options)
    bins = _deal(units, _task_count(spark, len(units)))
    out_struct = _units_struct()
    out_arrow = _arrow_schema(spark, out_struct)
    batch_rows = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
    regions = sorted({u[0].region_id for u in units})
    what = f"{len(units)} region batch(es) of {len(regions)} region(s)"
    set_job_description(spark, f"memwal merge: dedup of {what} in {len(bins)} task(s)")
    try:
        result = spark.range(0, len(bins), 1, len(bins)).mapInArrow(
            _unit_runner(units, bins, inline, store.uri, options, prefix, pk, schema, out_arrow, file_bytes,
                         max(1, batch_rows)),
            out_struct,
        ).toArrow()
    except BaseException as exc:
        _cleanup(store, prefix)
        if not isinstance(exc, Exception):
            raise
        if len(units) == 1:
            refs = units[0]
            raise MemWalError(f"region {refs[0].region_id}: Spark dedup of generations "
                              f"{[r.generation for r in refs]} failed: {spark_error_line(exc)}") from exc
        raise MemWalError(f"Spark dedup of {what} failed: {spark_error_line(exc)}") from exc
    finally:
        set_job_description(spark, None)

    key_schema = pa.schema([schema.field(c) for c in pk])
    files: dict[int, list[tuple[str, int]]] = {i: [] for i in range(len(units))}
    deleted_files: dict[int, list[tuple[str, int]]] = {i: [] for i in range(len(units))}
    done: dict[int, dict] = {}
    for r in result.to_pylist():
        u = r[_UNIT]
        if r[_ERROR] is not None or r[_FILE] is None:
            done[u] = r
            for t in _TIMES:
                stats[f"task_{t}"] = stats.get(f"task_{t}", 0.0) + (r[t] or 0.0)
        else:
            (deleted_files if r[_IS_DELETED] else files)[u].append((r[_FILE], r[_ROWS]))
    inputs: list[MergeInput | Exception] = []
    staged_rows = 0
    staging = _RoundStaging(store, prefix, len(units))
    for u, refs in enumerate(units):
        region, gens = refs[0].region_id, [r.generation for r in refs]
        info = done.get(u)
        if info is None or info[_ERROR] is not None:
            staging.done(u)
            reason = info[_ERROR] if info else "no result from its task"
            inputs.append(MemWalError(f"region {region}: Spark dedup of generations {gens} failed: {reason}"))
            continue
        if inline[u]:
            upserts = (pa.ipc.open_stream(info[_UPSERTS]).read_all() if info[_UPSERTS]
                       else schema.empty_table())
            deleted = (pa.ipc.open_stream(info[_DELETED]).read_all().cast(key_schema) if info[_DELETED]
                       else key_schema.empty_table())
            staging.done(u, staged=False)
            inputs.append(MergeInput(open_upserts=(lambda t=upserts: t), deleted_keys=deleted, rows_read=info[_READ]))
            stats["inline_batches"] = stats.get("inline_batches", 0) + 1
            continue
        paths = [p for p, _ in sorted(files[u])]
        staged_deletes = sum(n for _, n in deleted_files[u])
        if sum(n for _, n in files[u]) != info[_ROWS] or staged_deletes != info[_DELETED_ROWS]:
            staging.done(u)
            inputs.append(MemWalError(f"region {region}: Spark dedup of generations {gens} staged "
                                      f"{sum(n for _, n in files[u])} of {info[_ROWS]} rows and {staged_deletes} of "
                                      f"{info[_DELETED_ROWS]} deleted keys"))
            continue
        staged_rows += info[_ROWS]
        inputs.append(MergeInput(
            open_upserts=(lambda paths=paths: _open_staged(store, paths, schema)),
            deleted_keys=key_schema.empty_table(),
            rows_read=info[_READ],
            cleanup=(lambda u=u: staging.done(u)),
            staged=tuple(paths),
            staged_rows=info[_ROWS],
            staged_deleted=tuple(p for p, _ in sorted(deleted_files[u])),
            staged_deleted_rows=staged_deletes,
        ))
    took = time.monotonic() - started
    stats["jobs"] = stats.get("jobs", 0) + 1
    stats["tasks"] = stats.get("tasks", 0) + len(bins)
    stats["job_s"] = stats.get("job_s", 0.0) + took
    log.info("Spark dedup of %s in %d task(s): %d upserts staged under %s (%.1fs)",
             what, len(bins), staged_rows, prefix, took)
    return inputs


def _cleanup(store: ObjectStore, prefix: str) -> None:
    try:
        store.delete_prefix(prefix)
    except Exception as exc:  # a leftover staging prefix is garbage, not an error of the merge
        log.warning("could not delete the merge staging prefix %s: %s", prefix, exc)
