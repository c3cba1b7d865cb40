"""Version retention: remove the base-table versions the table's policy no longer keeps (Lance's
`cleanup_old_versions` with the planned versions), on the driver.

    spark-submit [spark options] /abs/path/spark_jobs/retention.py TABLE [--older-than-s S] \
        [--keep-versions N] [--delete-unverified] [--dry-run]

Calls `memwal.retention.retain_versions` (Lance deletes the files itself). Same options as
`memwal retention` (`memwal.jobs`). Prints one JSON line (`RetentionSummary.to_dict()`).
"""

from __future__ import annotations

import sys

from memwal import jobs
from spark_jobs import common


def build_parser():
    return common.job_parser("retention", "Remove base-table versions the retention policy no longer keeps.")


def run(spark, args):
    return jobs.run_job("retention", common.table(args), args.options, args.regions)


def main(argv: list[str] | None = None) -> int:
    return common.run_job("retention", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
