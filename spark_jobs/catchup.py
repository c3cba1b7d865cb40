"""Index catch-up: optimise the maintained base-table indexes and record index_catchup.

    spark-submit [spark options] /abs/path/spark_jobs/catchup.py TABLE [--index NAME]...

The work is Lance's optimize_indices on the driver (`memwal.catchup.catchup_table`); the library has no
parallel hook for it. Same options as `memwal catchup` (`memwal.jobs`). Prints one JSON line
(`CatchupSummary.to_dict()`); an index that failed or is not covered gives exit status 3.
"""

from __future__ import annotations

import logging
import sys

from memwal import jobs
from spark_jobs import common

log = logging.getLogger(__name__)


def build_parser():
    return common.job_parser("catchup", "Bring the maintained base-table indexes up to date (index_catchup).")


def run(spark, args):
    return jobs.run_job("catchup", common.table(args), args.options, args.regions)


def main(argv: list[str] | None = None) -> int:
    return common.run_job("catchup", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
