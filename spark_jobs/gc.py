"""Garbage collection of region directories (merged and caught-up generations, WAL, old manifests,
failed flushes, abandoned merge staging).

    spark-submit [spark options] /abs/path/spark_jobs/gc.py TABLE [--region UUID]... [--dry-run] \
        [--keep-manifest-versions N] [--grace-period-s S]

Calls `memwal.gc.gc_table` on the driver (the library has no parallel hook). Same options as
`memwal gc` (`memwal.jobs`). Prints one JSON line (`GcSummary.to_dict()`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memwal import jobs
from spark_jobs import common

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable


DESCRIPTION = "Remove what no reader of the MemWAL table needs any more."


def run(spark: Any, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    return jobs.run_job("gc", table, options, regions)


def main(argv: list[str] | None = None) -> int:
    return common.run_job("gc", run, argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
