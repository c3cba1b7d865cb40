"""A `memwal.task_runner.TaskRunner` on Spark: one Spark task per task, through the DataFrame API only
(`spark.range(n, numPartitions=n).mapInArrow`), so the same code runs on a classic session (spark-submit)
and on a Spark Connect session, which has no RDD API. The function and the tasks travel pickled with the
closure (they are metadata: plans, fragment ids, options); each result comes back pickled, in task order.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from memwal.task_runner import TaskRunner
from spark_jobs.common import set_job_description

__all__ = ["default_parallelism", "spark_runner"]

_RESULT = "i long, result binary"


Batches = Iterator[pa.RecordBatch]


def _apply(fn: Callable[[Any], Any], blobs: list[bytes]) -> Callable[[Batches], Batches]:
    def run(batches: Batches) -> Batches:
        for batch in batches:
            ids = batch.column(0).to_pylist()
            results = [pickle.dumps(fn(pickle.loads(blobs[i]))) for i in ids]
            yield pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array(results, pa.binary())],
                                             names=["i", "result"])

    return run


def spark_runner(spark: Any, description: str | None = None) -> TaskRunner:
    """A TaskRunner whose tasks run on the session's executors, one Spark task each."""

    def run(fn: Callable[[Any], Any], tasks: Sequence[Any], /) -> list[Any]:
        tasks = list(tasks)
        if not tasks:
            return []
        blobs = [pickle.dumps(t) for t in tasks]
        if description:
            set_job_description(spark, description)
        n = len(tasks)
        table = spark.range(0, n, 1, n).mapInArrow(_apply(fn, blobs), _RESULT).toArrow()
        by_id = dict(zip(table.column("i").to_pylist(), table.column("result").to_pylist(), strict=True))
        return [pickle.loads(by_id[i]) for i in range(n)]

    return run


def default_parallelism(spark: Any, fallback: int = 2) -> int:
    """The session's task slots (cores), for how many tasks to cut work into. A local master's cores are
    read from the master; a cluster's from the SparkContext, which Spark Connect lacks: there
    spark.default.parallelism if set, else the fallback."""
    from spark_jobs.common import local_cores

    try:
        master = spark.conf.get("spark.master", "") or ""
    except Exception:
        master = ""
    if master.startswith("local"):
        return local_cores(master)
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:
        try:
            return max(1, int(spark.conf.get("spark.default.parallelism")))
        except Exception:
            return fallback
