"""The merge's parallel part on Spark: `spark_dedup(spark)` is a `memwal.merge.Dedup` hook with `.batch`.

The merge planner, the commits and the conflict handling stay in `memwal.merge`. For each planning round
it hands this hook every region batch (consecutive generations of one region bound for one commit) at
once, and gets back one `MergeInput` per batch. Where each part lives: this module, the hook and the choice
of path; `spark_jobs.merge_units`, the one-job path (1, 2); `spark_jobs.merge_shuffle`, the shuffle (3);
`spark_jobs.spark_types`, Arrow types across Spark; without Spark, `memwal.region_batch` (a region batch
deduplicated and staged by a worker, and its `MergeInput` on the driver) and `memwal.staged_files`.

1. driver: the region batches are dealt to tasks (largest first, round-robin), `spark.range(P, numPartitions=P)`
   gives exactly one row per task, and ONE `mapInArrow` job runs them all, in parallel across executors;
2. executor, per region batch: read its generations with pylance, keep the newest row per key
   (`memwal.merge.dedup_generations`: the same pyarrow code as the in-process merge, so no value ever
   crosses Spark's type system), write the upserts, already in the base schema, as Arrow IPC files under
   the round's staging prefix (`_mem_wal/_staging/merge-<uuid4>/u<batch>/part-*.arrow`, through
   `memwal.storage.ObjectStore`, so S3 works too), and the deleted keys as one more file beside them
   (`part-deleted-*.arrow`), and return only file names and counts; a small batch (`inline_bytes`) returns
   its upserts and deleted keys in the result (Arrow IPC blobs) instead of staging them (a commit that
   also carries a staged batch stages them beside it: `memwal.merge`). A batch that fails
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
from collections.abc import Iterator, Sequence

import pyarrow as pa

from memwal import naming
from memwal.errors import MemWalError
from memwal.merge import Dedup, GenerationRef, MergeInput
from memwal.storage import ObjectStore
from spark_jobs.common import set_job_description
from spark_jobs.merge_shuffle import dedup_shuffle
from spark_jobs.merge_units import dedup_units, task_count, units_struct

__all__ = ["DEFAULT_INLINE_BYTES", "DEFAULT_TASK_BYTES", "STAGING_DIR", "spark_dedup", "warm_up"]

log = logging.getLogger(__name__)

STAGING_DIR = naming.STAGING_DIR
DEFAULT_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_TASK_BYTES = 256 * 1024 * 1024
DEFAULT_INLINE_BYTES = 1024 * 1024


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
        return dedup_batches(spark, batches, pk, schema, store, file_bytes, task_bytes,
                             min(inline_bytes, file_bytes), stats)

    def dedup(refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore) -> MergeInput:
        result = batch([refs], pk, schema, store)[0]
        if isinstance(result, Exception):
            raise result
        return result

    dedup.batch = batch
    dedup.stats = stats  # jobs, tasks, job_s (driver wall), task_read_s / task_dedup_s / task_stage_s (summed)
    return dedup


def dedup_batches(spark, batches: Sequence[Sequence[GenerationRef]], pk: list[str], schema: pa.Schema,
                  store: ObjectStore, file_bytes: int, task_bytes: int, inline_bytes: int,
                  stats: dict) -> list[MergeInput | Exception]:
    """One MergeInput (or the batch's error) per region batch: small ones in one job, large ones by shuffle."""
    out: list[MergeInput | Exception | None] = [None] * len(batches)
    small = [i for i, refs in enumerate(batches) if sum(r.nbytes for r in refs) <= task_bytes]
    for i, refs in enumerate(batches):
        if i not in small:
            try:
                out[i] = dedup_shuffle(spark, refs, pk, schema, store, file_bytes)
            except MemWalError as exc:
                out[i] = exc
    if small:
        for i, result in zip(small, dedup_units(spark, [list(batches[i]) for i in small], pk, schema, store,
                                                file_bytes, inline_bytes, stats), strict=True):
            out[i] = result
    return out


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
    n = task_count(spark, 1 << 30)
    set_job_description(spark, "memwal merge: start the executors' Python workers")
    try:
        spark.range(0, n, 1, n).mapInArrow(_warm, units_struct()).toArrow()  # the dedup job's own plan
    finally:
        set_job_description(spark, None)
    return time.monotonic() - started
