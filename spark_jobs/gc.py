"""Garbage collection of region directories (merged and caught-up generations, WAL, old manifests,
failed flushes, abandoned merge staging).

    spark-submit [spark options] /abs/path/spark_jobs/gc.py TABLE [--region UUID]... [--dry-run] \
        [--keep-manifest-versions N] [--grace-period-s S]

Calls `memwal.gc.gc_table` on the driver (the library has no parallel hook). Same options as
`memwal gc` (`memwal.jobs`). Prints one JSON line (`GcSummary.to_dict()`).
"""

from __future__ import annotations

import sys

from memwal import jobs
from spark_jobs import common


def build_parser():
    return common.job_parser("gc", "Remove what no reader of the MemWAL table needs any more.")


def run(spark, args):
    return jobs.run_job("gc", common.table(args), args.options, args.regions)


def main(argv: list[str] | None = None) -> int:
    return common.run_job("gc", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
