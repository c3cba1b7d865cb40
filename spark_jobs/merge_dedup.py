"""The merge's parallel part on Spark: `spark_dedup(spark)` is a `memwal.merge.Dedup` hook.

The merge planner, the commit and the conflict handling stay in `memwal.merge`; for each commit it asks
the hook for the newest version of every key among the planned generations. This module does that on
the executors:

1. driver: one task per fragment of each planned generation (Lance metadata only; it also gives
   rows_read without reading data);
2. `spark.range(n, numPartitions=n)` is a DataFrame with exactly one row per task, and `mapInArrow`
   opens that generation fragment with pylance on the executor and yields its rows with the generation
   (`GEN_COLUMN`) and row address (`ROWADDR_COLUMN`);
3. `row_number()` over the primary key ordered by (generation desc, row address desc) keeps the newest
   version of each key: the same rule as `memwal.dedup.newest_per_key`;
4. a second `mapInArrow` splits the winners with `memwal.merge.split_winners`; the executors write the
   upserts, already in the base schema, as Arrow IPC files under a fresh staging prefix of the table
   (`_mem_wal/_staging/merge-<uuid4>/part-*.arrow`, through `memwal.storage.ObjectStore`, so S3 works
   too) and return only the file names and the tombstoned keys.

The driver never holds the upserts: `open_upserts()` streams the staged files one batch at a time and
can be called again for a retried commit; `cleanup()` deletes the staging prefix (the library calls it
after every commit attempt; a failed Spark job cleans up before raising).

Spark has no unsigned integers and stores timestamps in microseconds, so values cross Spark in a wider
Spark type (uint64 as DECIMAL(20,0), fixed-size lists as arrays) and are cast back to the base schema on
the executors. A cast that would lose data (e.g. nanosecond timestamps with sub-microsecond parts) fails
the job instead of changing data.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN
from memwal.errors import MemWalError
from memwal.generation import open_generation
from memwal.merge import Dedup, GenerationRef, MergeInput, split_winners
from memwal.storage import ObjectStore
from spark_jobs.common import spark_error_line

__all__ = ["STAGING_DIR", "spark_dedup"]

log = logging.getLogger(__name__)

STAGING_DIR = f"{naming.MEM_WAL_DIR}/_staging"
DEFAULT_FILE_BYTES = 64 * 1024 * 1024
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


def spark_dedup(spark, *, file_bytes: int = DEFAULT_FILE_BYTES) -> Dedup:
    """A `memwal.merge.Dedup` that dedups on Spark and stages the upserts as Arrow IPC files.

    file_bytes: an executor starts a new staged file after about this many bytes, which also bounds
    what the driver holds while streaming them into the commit.
    """

    def dedup(refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore) -> MergeInput:
        return _dedup(spark, refs, pk, schema, store, file_bytes)

    return dedup


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
    """Arrow IPC files of upserts, rolled over at about file_bytes, written with ObjectStore."""

    def __init__(self, store: ObjectStore, prefix: str, schema: pa.Schema, file_bytes: int, tag: str):
        self.store, self.prefix, self.schema, self.file_bytes, self.tag = store, prefix, schema, file_bytes, tag
        self.written: list[tuple[str, int]] = []
        self._sink: pa.BufferOutputStream | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self._sink = pa.BufferOutputStream()
            self._writer = pa.ipc.new_file(self._sink, self.schema)
            self._rows = 0
        self._writer.write_table(table)
        self._rows += table.num_rows
        if self._sink.tell() >= self.file_bytes:
            self.finish()

    def finish(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        path = f"{self.prefix}/part-{self.tag}-{len(self.written):04d}.arrow"
        self.store.put(path, self._sink.getvalue().to_pybytes())
        self.written.append((path, self._rows))
        self._writer = self._sink = None


def _writer(uri: str, storage_options: dict, prefix: str, schema: pa.Schema, pk: list[str], out: pa.Schema,
            file_bytes: int):
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}" if ctx else uuid.uuid4().hex
        staged = _StagedFiles(ObjectStore(uri, storage_options), prefix, schema, file_bytes, tag)
        key_fields = [out.field(c) for c in pk]
        for batch in batches:
            upserts, deletes = split_winners(pa.Table.from_batches([batch]), pk, schema)
            staged.write(upserts)
            if deletes.num_rows:
                n = deletes.num_rows
                cols = [deletes.column(f.name).cast(f.type) for f in key_fields]
                yield pa.RecordBatch.from_arrays(
                    [c.combine_chunks() for c in cols] + [pa.nulls(n, out.field(_FILE).type), pa.nulls(n, pa.int64())],
                    schema=out,
                )
        staged.finish()
        if staged.written:
            paths, counts = zip(*staged.written, strict=True)
            n = len(paths)
            yield pa.RecordBatch.from_arrays(
                [pa.nulls(n, f.type) for f in key_fields]
                + [pa.array(paths, out.field(_FILE).type), pa.array(counts, pa.int64())],
                schema=out,
            )

    return write


# --- driver -------------------------------------------------------------------------------------------


def _open_staged(store: ObjectStore, paths: Sequence[str], schema: pa.Schema) -> pa.RecordBatchReader:
    """A fresh reader over the staged files: one file in memory at a time, one batch out at a time."""

    def batches() -> Iterator[pa.RecordBatch]:
        for path in paths:
            reader = pa.ipc.open_file(pa.py_buffer(store.get(path)))
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    return pa.RecordBatchReader.from_batches(schema, batches())


def _set_job_description(spark, text: str | None) -> None:
    try:
        spark.sparkContext.setJobDescription(text)
    except Exception:  # Spark Connect has no SparkContext; the description is only cosmetic
        pass


def _dedup(spark, refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore,
           file_bytes: int) -> MergeInput:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType

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
        return MergeInput(lambda: pa.RecordBatchReader.from_batches(schema, iter(())), empty.select(pk))
    region = refs[0].region_id
    gens = [r.generation for r in refs]

    rows_struct = _rows_struct(schema)
    rows_arrow = _arrow_schema(spark, rows_struct)
    key_types = {f.name: f.dataType for f in rows_struct.fields}
    out_struct = _struct([(c, key_types[c]) for c in pk] + [(_FILE, StringType()), (_ROWS, LongType())])
    out_arrow = _arrow_schema(spark, out_struct)
    prefix = f"{STAGING_DIR}/merge-{uuid.uuid4()}"
    options = dict(store.storage_options)

    def col(name: str):
        return F.col("`" + name.replace("`", "``") + "`")

    newest = Window.partitionBy(*[col(c) for c in pk]).orderBy(col(GEN_COLUMN).desc(), col(ROWADDR_COLUMN).desc())
    _set_job_description(spark, f"memwal merge: region {region} generations {gens[0]}..{gens[-1]}")
    try:
        rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(
            _reader(tasks, store.uri, options, rows_arrow), rows_struct
        )
        winners = rows.withColumn(_RANK, F.row_number().over(newest)).filter(col(_RANK) == 1).drop(_RANK)
        result = winners.mapInArrow(
            _writer(store.uri, options, prefix, schema, pk, out_arrow, file_bytes), out_struct
        ).toArrow()
        is_file = pc.is_valid(result.column(_FILE))
        staged = result.filter(is_file)
        files = sorted(zip(staged.column(_FILE).to_pylist(), staged.column(_ROWS).to_pylist(), strict=True))
        deleted = result.filter(pc.invert(is_file)).select(pk).cast(pa.schema([schema.field(c) for c in pk]))
        if deleted.num_rows:
            deleted = deleted.sort_by([(c, "ascending") for c in pk])
    except BaseException as exc:
        _cleanup(store, prefix)
        if not isinstance(exc, Exception):
            raise
        raise MemWalError(
            f"region {region}: Spark dedup of generations {gens} failed: {spark_error_line(exc)}"
        ) from exc
    finally:
        _set_job_description(spark, None)

    paths = [p for p, _ in files]
    log.info(
        "region %s: Spark dedup of generations %d..%d: %d rows read from %d fragments, %d upserts staged in "
        "%d files under %s, %d deletes (%.1fs)",
        region, gens[0], gens[-1], rows_read, len(tasks), sum(n for _, n in files), len(files), prefix,
        deleted.num_rows, time.monotonic() - started,
    )
    return MergeInput(
        open_upserts=lambda: _open_staged(store, paths, schema),
        deleted_keys=deleted,
        rows_read=rows_read,
        cleanup=lambda: _cleanup(store, prefix),
    )


def _cleanup(store: ObjectStore, prefix: str) -> None:
    try:
        store.delete_prefix(prefix)
    except Exception as exc:  # a leftover staging prefix is garbage, not an error of the merge
        log.warning("could not delete the merge staging prefix %s: %s", prefix, exc)
