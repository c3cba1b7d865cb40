"""The Spark dedup's one-job path: every small region batch (a unit) of a planning round in ONE `mapInArrow`.

Driver: the units are dealt to tasks (largest first, each to the task with the fewest bytes so far),
`spark.range(P, numPartitions=P)` gives exactly one row per task. Executor: each unit read, deduplicated and
staged, or kept inline when small (`memwal.region_batch.stage_region_batch`); a unit that fails returns its
error instead, so only that region fails. Back on the driver, the rows of each unit become its `MergeInput`
(`memwal.region_batch.batch_input`). This module only carries those results across Spark as rows.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa

from memwal import naming
from memwal.errors import MemWalError
from memwal.merge import GenerationRef, MergeInput
from memwal.planning import largest_first
from memwal.region_batch import TIMES, StagedBatch, batch_input, stage_region_batch
from memwal.staged_files import RoundStaging, delete_staging, unit_prefix
from memwal.storage import ObjectStore
from spark_jobs.common import one_line, set_job_description, spark_error_line
from spark_jobs.merge_shuffle import FILE, IS_DELETED, ROWS
from spark_jobs.spark_types import arrow_schema, struct
from spark_jobs.task_runner import default_parallelism

__all__ = ["INLINE_ROUND_BYTES", "dedup_units", "task_count", "units_struct"]

log = logging.getLogger(__name__)

INLINE_ROUND_BYTES = 64 * 1024 * 1024  # inline results per job at most (they all come back to the driver)
_UNIT = "__memwal_unit"
_READ = "__memwal_rows_read"
_DELETED = "__memwal_deleted"
_DELETED_ROWS = "__memwal_deleted_rows"  # deleted keys a staged batch staged (its files' rows add up to it)
_UPSERTS = "__memwal_upserts"
_ERROR = "__memwal_error"
_LOWEST = ("__memwal_lowest_upsert", "__memwal_lowest_delete")  # StagedBatch.lowest (null: none)
_LOWEST_KNOWN = "__memwal_lowest_known"


def units_struct():
    """The Spark schema of the rows a unit task returns: one per staged file, then one summary per unit."""
    from pyspark.sql.types import BinaryType, BooleanType, DoubleType, LongType, StringType

    return struct([(_UNIT, LongType()), (FILE, StringType()), (ROWS, LongType()), (_READ, LongType()),
                   (IS_DELETED, BooleanType()), (_DELETED, BinaryType()), (_DELETED_ROWS, LongType()),
                   (_UPSERTS, BinaryType()), (_ERROR, StringType()), (_LOWEST[0], LongType()),
                   (_LOWEST[1], LongType()), (_LOWEST_KNOWN, BooleanType())]
                  + [(t, DoubleType()) for t in TIMES])


def _summary_row(unit: int, result: StagedBatch | None = None, error: str | None = None) -> dict:
    r = result or StagedBatch()
    return {_UNIT: unit, FILE: None, ROWS: r.upserts, _READ: r.rows_read, IS_DELETED: False,
            _DELETED: r.inline_deleted, _DELETED_ROWS: r.deleted, _UPSERTS: r.inline_upserts, _ERROR: error,
            **dict(zip(_LOWEST, r.lowest or (None, None), strict=True)), _LOWEST_KNOWN: r.lowest is not None,
            **dict(zip(TIMES, r.times, strict=True))}


def _file_row(unit: int, path: str, rows: int, is_deleted: bool) -> dict:
    return {_UNIT: unit, FILE: path, ROWS: rows, _READ: 0, IS_DELETED: is_deleted, _DELETED: None,
            _DELETED_ROWS: 0, _UPSERTS: None, _ERROR: None, **dict.fromkeys(_LOWEST), _LOWEST_KNOWN: False,
            **dict.fromkeys(TIMES, 0.0)}


def _unit_runner(units: list[list[GenerationRef]], bins: list[list[int]], inline: list[bool], store: ObjectStore,
                 prefix: str, pk: list[str], schema: pa.Schema, out: pa.Schema, file_bytes: int, batch_rows: int):
    """Executor: the region batches of one task, each read, deduplicated and staged (or returned inline)."""
    uri, storage_options = store.uri, dict(store.storage_options)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = f"{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}" if ctx else uuid.uuid4().hex
        here = ObjectStore(uri, storage_options)
        results: list[dict] = []  # one Arrow batch per task at the end: each batch costs a round trip
        for ids in batches:
            for b in ids.column(0).to_pylist():
                for unit in bins[b]:
                    try:
                        done = stage_region_batch(here, units[unit], pk, schema, prefix=unit_prefix(prefix, unit),
                                                  tag=attempt, inline=inline[unit], file_bytes=file_bytes,
                                                  batch_rows=batch_rows)
                    except Exception as exc:  # reported as this region's failure; the other batches go on
                        results.append(_summary_row(unit, error=one_line(exc)))
                        continue
                    results += [_file_row(unit, p, n, False) for p, n in done.files]
                    results += [_file_row(unit, p, n, True) for p, n in done.deleted_files]
                    results.append(_summary_row(unit, done))
        if results:
            yield pa.RecordBatch.from_pylist(results, schema=out)

    return run


def _staged_batches(result: pa.Table, inline: list[bool], stats: dict) -> dict[int, StagedBatch | str]:
    """Each unit's StagedBatch (or its error message) from the job's rows; the tasks' seconds into stats."""
    files: dict[int, list[tuple[str, int]]] = {}
    deleted_files: dict[int, list[tuple[str, int]]] = {}
    out: dict[int, StagedBatch | str] = {}
    for r in result.to_pylist():
        u = r[_UNIT]
        if r[FILE] is not None:
            (deleted_files if r[IS_DELETED] else files).setdefault(u, []).append((r[FILE], r[ROWS]))
            continue
        for t in TIMES:
            stats[f"task_{t}"] = stats.get(f"task_{t}", 0.0) + (r[t] or 0.0)
        out[u] = r[_ERROR] if r[_ERROR] is not None else StagedBatch(
            inline=inline[u], upserts=r[ROWS], deleted=r[_DELETED_ROWS], rows_read=r[_READ],
            inline_upserts=r[_UPSERTS], inline_deleted=r[_DELETED],
            lowest=(r[_LOWEST[0]], r[_LOWEST[1]]) if r[_LOWEST_KNOWN] else None)
    for u, batch in out.items():
        if isinstance(batch, StagedBatch):
            batch.files, batch.deleted_files = files.get(u, []), deleted_files.get(u, [])
    return out


def _deal(units: Sequence[Sequence[GenerationRef]], tasks: int) -> list[list[int]]:
    """Units dealt to tasks, largest first, each to the task with the fewest bytes so far."""
    return largest_first([sum(r.nbytes for r in unit) for unit in units], tasks)


def task_count(spark, n_units: int) -> int:
    """One task per core: the deal balances the bytes, and on a small round every extra wave of tasks costs
    more in Spark's task overhead (about 0.1 s a wave, measured) than it could balance."""
    return max(1, min(n_units, default_parallelism(spark)))


def _inline_units(units: Sequence[Sequence[GenerationRef]], inline_bytes: int) -> list[bool]:
    """Which units return their result inline: at most inline_bytes each, INLINE_ROUND_BYTES together."""
    inline, total = [], 0
    for refs in units:
        size = sum(r.nbytes for r in refs)
        inline.append(size <= inline_bytes and total + size <= INLINE_ROUND_BYTES)
        total += size if inline[-1] else 0
    return inline


def dedup_units(spark, units: list[list[GenerationRef]], pk: list[str], schema: pa.Schema, store: ObjectStore,
                file_bytes: int, inline_bytes: int, stats: dict) -> list[MergeInput | Exception]:
    """One MergeInput (or the unit's error) per unit, from one Spark job; MemWalError if the job fails."""
    started = time.monotonic()
    inline = _inline_units(units, inline_bytes)
    prefix = f"{naming.STAGING_DIR}/merge-{uuid.uuid4()}"
    bins = _deal(units, task_count(spark, len(units)))
    out_struct = units_struct()
    batch_rows = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
    what = f"{len(units)} region batch(es) of {len({u[0].region_id for u in units})} region(s)"
    set_job_description(spark, f"memwal merge: dedup of {what} in {len(bins)} task(s)")
    try:
        result = spark.range(0, len(bins), 1, len(bins)).mapInArrow(
            _unit_runner(units, bins, inline, store, prefix, pk, schema, arrow_schema(spark, out_struct),
                         file_bytes, max(1, batch_rows)),
            out_struct,
        ).toArrow()
    except BaseException as exc:
        delete_staging(store, prefix)
        if not isinstance(exc, Exception):
            raise
        if len(units) == 1:
            refs = units[0]
            raise MemWalError(f"region {refs[0].region_id}: Spark dedup of generations "
                              f"{[r.generation for r in refs]} failed: {spark_error_line(exc)}") from exc
        raise MemWalError(f"Spark dedup of {what} failed: {spark_error_line(exc)}") from exc
    finally:
        set_job_description(spark, None)

    batches = _staged_batches(result, inline, stats)
    staging = RoundStaging(store, prefix, len(units))
    inputs = [batch_input(store, refs, batches.get(u, "no result from its task"), schema, pk, staging, u)
              for u, refs in enumerate(units)]
    inlined = sum(isinstance(b, StagedBatch) and b.inline for b in batches.values())
    if inlined:
        stats["inline_batches"] = stats.get("inline_batches", 0) + inlined
    took = time.monotonic() - started
    stats["jobs"] = stats.get("jobs", 0) + 1
    stats["tasks"] = stats.get("tasks", 0) + len(bins)
    stats["job_s"] = stats.get("job_s", 0.0) + took
    log.info("Spark dedup of %s in %d task(s): %d upserts staged under %s (%.1fs)", what, len(bins),
             sum(x.staged_rows for x in inputs if isinstance(x, MergeInput)), prefix, took)
    return inputs
