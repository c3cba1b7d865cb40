"""Index catch-up: optimise the maintained base-table indexes and record index_catchup.

    spark-submit [spark options] /abs/path/spark_jobs/catchup.py TABLE [--index NAME]...

`memwal.catchup.catchup_table` with a `DistributedBuild` on `spark_runner(spark)`: an index with enough rows
to index (`memwal.index_build.DISTRIBUTED_MIN_ROWS` by kind, or `--conf spark.memwal.indexBuildMinRows=N`)
has its segments built one Spark task per fragment group, as many groups as task slots, Lance's threads
sized to `spark.task.cpus`; the commit and the rest on the driver. Same options as `memwal catchup`
(`memwal.jobs`). Prints one JSON line (`CatchupSummary.to_dict()`, each index with `where` and `why`); an
index that failed or is not covered gives exit status 3.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memwal import index_build, jobs
from memwal.catchup import DistributedBuild
from spark_jobs import common
from spark_jobs.task_runner import default_parallelism, spark_runner

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

log = logging.getLogger(__name__)

DESCRIPTION = "Bring the maintained base-table indexes up to date (index_catchup)."


def task_slots(spark) -> tuple[int, int]:
    """(tasks that can run at once, cores per task) of the session: local[N] from the master, a cluster from
    the default parallelism (all executor cores), divided by spark.task.cpus."""
    cpus = max(1, int(spark.conf.get("spark.task.cpus", "1")))
    return max(1, default_parallelism(spark) // cpus), cpus


# Rows to index from which every index is built on the executors (default: by kind, DISTRIBUTED_MIN_ROWS).
MIN_ROWS_CONF = "spark.memwal.indexBuildMinRows"


def distributed_build(spark, **overrides) -> DistributedBuild:
    """Catch-up's segment builds on the session's executors (`--conf spark.memwal.indexBuildMinRows=N`: the
    threshold for every index kind)."""
    slots, cpus = task_slots(spark)
    configured = spark.conf.get(MIN_ROWS_CONF, None)
    settings = {"groups": slots, "threads": cpus, "where": "spark", "min_group_rows": index_build.MIN_GROUP_ROWS,
                "min_rows": int(configured) if configured else None, **overrides}
    return DistributedBuild(spark_runner(spark, "memwal catch-up: index segments"), **settings)


def run(spark: Any, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    return jobs.run_job("catchup", table, options, regions, distributed=distributed_build(spark))


def main(argv: list[str] | None = None) -> int:
    return common.run_job("catchup", run, argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
