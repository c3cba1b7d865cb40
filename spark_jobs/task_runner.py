"""A `memwal.task_runner.TaskRunner` on Spark: one Spark task per task, through the DataFrame API only
(`createDataFrame(...).mapInArrow`), so the same code runs on a classic session (spark-submit) and on a
Spark Connect session, which has no RDD API. The function travels pickled in the closure; each task's pickle
travels as a row of the DataFrame, so a Spark task receives its own task's input only, never the whole list
(one row a partition: Spark makes one per core at most, more tasks are range-partitioned one a partition);
each result comes back pickled, in task order. `stats` on the runner: the bytes of the last run's closure
and of each task's pickle.
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


def _apply(fn: Callable[[Any], Any]) -> Callable[[Batches], Batches]:
    def run(batches: Batches) -> Batches:
        for batch in batches:
            ids = batch.column("i").to_pylist()
            blobs = batch.column("task").to_pylist()
            results = [pickle.dumps(fn(pickle.loads(blob))) for blob in blobs]
            yield pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array(results, pa.binary())],
                                             names=["i", "result"])

    return run


def spark_runner(spark: Any, description: str | None = None) -> TaskRunner:
    """A TaskRunner whose tasks run on the session's executors; each Spark task gets its own tasks' pickles."""
    stats: dict[str, Any] = {}

    def run(fn: Callable[[Any], Any], tasks: Sequence[Any], /) -> list[Any]:
        tasks = list(tasks)
        if not tasks:
            return []
        from pyspark import cloudpickle

        blobs = [pickle.dumps(t) for t in tasks]
        body = _apply(fn)
        stats.update(closure_bytes=len(cloudpickle.dumps(body)), task_bytes=[len(b) for b in blobs])
        if description:
            set_job_description(spark, description)
        n = len(tasks)
        inputs = spark.createDataFrame(pa.table({"i": pa.array(range(n), pa.int64()),
                                                 "task": pa.array(blobs, pa.binary())}))
        if n > default_parallelism(spark):  # Spark cut the rows into one run per core: one task each again,
            inputs = inputs.repartitionByRange(n, "i")  # scheduled as cores free up (tasks of uneven size)
        table = inputs.mapInArrow(body, _RESULT).toArrow()
        by_id = dict(zip(table.column("i").to_pylist(), table.column("result").to_pylist(), strict=True))
        return [pickle.loads(by_id[i]) for i in range(n)]

    run.stats = stats
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
