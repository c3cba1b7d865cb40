"""Compaction of the base table with Lance's distributed API: plan and commit on the driver, the tasks
on the executors.

    spark-submit [spark options] /abs/path/spark_jobs/compaction.py TABLE [--force] \
        [--target-rows-per-fragment N] [--max-tasks-per-round N] ...

`memwal.compaction.compact_table` takes an `execute(tasks, table)` hook; here it is
`spark_executor(spark)`: the pickled `CompactionTask`s go out one per Spark task through the TaskRunner
(`spark_jobs.task_runner`: DataFrame operations only, so classic and Spark Connect sessions alike), each
executor opens the table and runs `task.execute`, and the pickled `RewriteResult`s come back to the driver,
which commits them with the plan's options. Same options as `memwal compaction` (`memwal.jobs`). Prints one JSON line
(`CompactionSummary.to_dict()`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memwal import jobs
from memwal.compaction import Execute
from spark_jobs import common
from spark_jobs.task_runner import spark_runner

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable


def _execute_on_executor(table):
    """The task function: the handle pickles to its URI and storage options and opens the table there."""
    def run(task):
        return task.execute(table.dataset)

    return run


def spark_executor(spark) -> Execute:
    """An `execute` hook running each compaction task as one Spark task."""

    runner = spark_runner(spark, "memwal compaction: rewrite fragments")

    def execute(tasks: Sequence, table) -> list:
        return runner(_execute_on_executor(table), list(tasks))

    return execute


DESCRIPTION = "Compact the base table's fragments (tasks on the executors)."


def run(spark: Any, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    return jobs.run_job("compaction", table, options, regions, execute=spark_executor(spark))


def main(argv: list[str] | None = None) -> int:
    return common.run_job("compaction", run, argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
