"""Version retention: remove the base-table versions the table's policy no longer keeps (Lance's
`cleanup_old_versions` with the planned versions), on the driver.

    spark-submit [spark options] /abs/path/spark_jobs/retention.py TABLE [--older-than-s S] \
        [--keep-versions N] [--delete-unverified] [--dry-run]

Calls `memwal.retention.retain_versions` (Lance deletes the files itself). Same options as
`memwal retention` (`memwal.jobs`). Prints one JSON line (`RetentionSummary.to_dict()`).
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


DESCRIPTION = "Remove base-table versions the retention policy no longer keeps."


def run(spark: Any, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> dict[str, Any]:
    return jobs.run_job("retention", table, options, regions)


def main(argv: list[str] | None = None) -> int:
    return common.run_job("retention", run, argv, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
