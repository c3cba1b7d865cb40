"""Merge flushed generations into the base table, with the per-key dedup on Spark.

    spark-submit [spark options] /abs/path/spark_jobs/merge.py TABLE [--region UUID]... \
        [--max-generations-per-commit N] [--max-bytes-per-commit SIZE] [--up-to-generation G]

Planning, commits and conflict handling are `memwal.merge`'s; Spark dedups every region batch of a planning
round in one job (`spark_jobs.merge_dedup`), after starting the executors' Python workers (`spark_warmup_s`),
and, with `--apply auto` (the default) or `fragments`, applies each commit fragment by fragment on the
executors (`memwal.merge_apply` through `spark_jobs.task_runner.spark_runner`: the lookups and the fragment
rewrites run as Spark tasks, one per core; the driver commits the Update and the marker).
Prints one JSON line (`MergeSummary.to_dict()`) on stdout; see `spark_jobs.common` for exit statuses.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memwal import jobs
from spark_jobs import common
from spark_jobs.merge_dedup import spark_dedup, warm_up
from spark_jobs.task_runner import default_parallelism, spark_runner

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable


DESCRIPTION = "Merge flushed MemWAL generations into the base table (dedup on Spark)."


def run(spark: Any, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    # Part of a new application's start-up, reported apart (spark_warmup_s). A Spark Connect session's
    # workers are shared and warm (spark_jobs.connect): nothing to start there.
    warm_s = 0.0 if type(spark).__module__.startswith("pyspark.sql.connect") else warm_up(spark)
    dedup = spark_dedup(spark)
    summary = jobs.run_job("merge", table, options, regions, dedup=dedup,
                           runner=spark_runner(spark, "memwal merge apply"), parallelism=default_parallelism(spark))
    summary["spark_warmup_s"] = round(warm_s, 3)
    summary["spark_dedup"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in dedup.stats.items()}
    return summary


def main(argv: list[str] | None = None) -> int:
    return common.run_job("merge", run, argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
