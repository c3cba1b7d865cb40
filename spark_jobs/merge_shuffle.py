"""The Spark dedup's shuffle path: one region batch larger than a task (`task_bytes`) spread over the cluster.

One task per generation fragment reads its rows (`conform`ed to Spark's types: `spark_jobs.spark_types`),
a window per key keeps the newest (`row_number()` over the primary key ordered by generation desc, row
address desc: the rule of `memwal.dedup.newest_per_key`), and a second `mapInArrow` stages the winners,
upserts and deleted keys in files of their own (`memwal.staged_files`), returning only paths and counts.
A cast back that would lose data fails the batch.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN
from memwal.errors import MemWalError
from memwal.generation import open_generation
from memwal.merge import GenerationRef, MergeInput, lowest_winners, split_winners
from memwal.staged_files import StagedFiles, delete_staging, open_staged
from memwal.storage import ObjectStore
from spark_jobs.common import set_job_description, spark_error_line
from spark_jobs.spark_types import arrow_schema, conform, rows_struct, struct

__all__ = ["FILE", "IS_DELETED", "ROWS", "dedup_shuffle"]

log = logging.getLogger(__name__)

FILE = "__memwal_file"
ROWS = "__memwal_rows"
IS_DELETED = "__memwal_is_deleted"  # a staged file holds deleted keys (else upserts)
_LOWEST = "__memwal_lowest"  # the lowest generation among its task's winners of the file's kind
_RANK = "__memwal_rank"


@dataclass(frozen=True)
class FragmentTask:
    """One executor task: one fragment of one generation."""

    region_id: str
    generation: int
    path: str
    fragment_id: int


# --- executor functions (closures are shipped by cloudpickle; they import memwal on the executor) ------


def _reader(tasks: list[FragmentTask], store: ObjectStore, target: pa.Schema):
    uri, storage_options = store.uri, dict(store.storage_options)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        here = ObjectStore(uri, storage_options)
        for ids in batches:
            for i in ids.column(0).to_pylist():
                task = tasks[i]
                ds = open_generation(here, task.region_id, task.generation, task.path)
                scanner = ds.scanner(fragments=[ds.get_fragment(task.fragment_id)], with_row_address=True)
                for batch in scanner.to_batches():
                    if batch.num_rows:
                        yield conform(batch, task.generation, target)

    return read


def _writer(store: ObjectStore, prefix: str, schema: pa.Schema, pk: list[str], out: pa.Schema, file_bytes: int):
    """Executor: the winners of one shuffle partition staged as files, upserts and deleted keys apart; one
    row per file (path, rows, and whether it holds deleted keys)."""
    uri, storage_options = store.uri, dict(store.storage_options)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}" if ctx else uuid.uuid4().hex
        here = ObjectStore(uri, storage_options)
        staged = StagedFiles(here, prefix, schema, file_bytes, tag)
        key_schema = pa.schema([schema.field(c) for c in pk])
        deleted = StagedFiles(here, prefix, key_schema, file_bytes, f"deleted-{tag}")
        low: list[int | None] = [None, None]  # of the upserts, of the deleted keys (lowest_winners)
        for batch in batches:
            winners = pa.Table.from_batches([batch])
            low = [min((g for g in (a, b) if g is not None), default=None)
                   for a, b in zip(low, lowest_winners(winners), strict=True)]
            upserts, deletes = split_winners(winners, pk, schema)
            staged.write(upserts)
            deleted.write(deletes.select(pk).cast(key_schema))
        staged.finish()
        deleted.finish()
        files = ([(p, n, False, low[0]) for p, n in staged.written]
                 + [(p, n, True, low[1]) for p, n in deleted.written])
        if files:
            paths, counts, kinds, lows = zip(*files, strict=True)
            yield pa.RecordBatch.from_arrays([pa.array(paths, pa.string()), pa.array(counts, pa.int64()),
                                              pa.array(kinds, pa.bool_()), pa.array(lows, pa.int64())],
                                             schema=out)

    return write


# --- driver -------------------------------------------------------------------------------------------


def _fragment_tasks(refs: Sequence[GenerationRef], store: ObjectStore) -> tuple[list[FragmentTask], int]:
    """One task per fragment of the batch's generations, and the rows they hold."""
    tasks: list[FragmentTask] = []
    rows_read = 0
    for ref in refs:
        ds = open_generation(store, ref.region_id, ref.generation, ref.path)
        for fragment in ds.get_fragments():
            tasks.append(FragmentTask(ref.region_id, ref.generation, ref.path, fragment.fragment_id))
            rows_read += fragment.count_rows()
    return tasks, rows_read


def dedup_shuffle(spark, refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore,
                  file_bytes: int) -> MergeInput:
    """One region batch deduplicated by a shuffle; its upserts and deleted keys staged (MemWalError if the
    Spark job fails: its staging prefix is deleted first)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, LongType, StringType

    started = time.monotonic()
    tasks, rows_read = _fragment_tasks(refs, store)
    if not tasks:  # nothing planned, or only empty generations
        empty = schema.empty_table()
        return MergeInput(lambda: empty, empty.select(pk))
    region = refs[0].region_id
    gens = [r.generation for r in refs]

    spark_rows = rows_struct(schema)
    rows_arrow = arrow_schema(spark, spark_rows)
    out_struct = struct([(FILE, StringType()), (ROWS, LongType()), (IS_DELETED, BooleanType()),
                         (_LOWEST, LongType())])
    out_arrow = arrow_schema(spark, out_struct)
    prefix = f"{naming.STAGING_DIR}/merge-{uuid.uuid4()}"

    def col(name: str):
        return F.col("`" + name.replace("`", "``") + "`")

    newest = Window.partitionBy(*[col(c) for c in pk]).orderBy(col(GEN_COLUMN).desc(), col(ROWADDR_COLUMN).desc())
    set_job_description(spark, f"memwal merge: region {region} generations {gens[0]}..{gens[-1]}")
    try:
        rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(_reader(tasks, store, rows_arrow), spark_rows)
        winners = rows.withColumn(_RANK, F.row_number().over(newest)).filter(col(_RANK) == 1).drop(_RANK)
        result = winners.mapInArrow(_writer(store, prefix, schema, pk, out_arrow, file_bytes), out_struct).toArrow()
        listed = sorted(zip(result.column(FILE).to_pylist(), result.column(ROWS).to_pylist(),
                            result.column(IS_DELETED).to_pylist(), strict=True))
        files = [(p, n) for p, n, gone in listed if not gone]
        deleted_files = [(p, n) for p, n, gone in listed if gone]
        lows = list(zip(result.column(IS_DELETED).to_pylist(), result.column(_LOWEST).to_pylist(), strict=True))
        lowest = tuple(min((g for gone, g in lows if gone == kind and g is not None), default=None)
                       for kind in (False, True))
    except BaseException as exc:
        delete_staging(store, prefix)
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
        open_upserts=lambda: open_staged(store, paths, schema),
        deleted_keys=pa.schema([schema.field(c) for c in pk]).empty_table(),
        rows_read=rows_read,
        cleanup=lambda: delete_staging(store, prefix),
        staged=tuple(paths),
        staged_rows=sum(n for _, n in files),
        staged_deleted=tuple(p for p, _ in deleted_files),
        staged_deleted_rows=deletes,
        winners={region: lowest},
    )
