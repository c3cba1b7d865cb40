"""Merge flushed generations into the base table, with the per-key dedup on Spark.

    spark-submit [spark options] /abs/path/spark_jobs/merge.py TABLE [--region UUID]... \
        [--max-generations-per-commit N] [--max-bytes-per-commit SIZE] [--up-to-generation G]

Planning, commits and conflict handling are `memwal.merge`'s; Spark only dedups (`spark_jobs.merge_dedup`).
Prints one JSON line (`MergeSummary.to_dict()`) on stdout; see `spark_jobs.common` for exit statuses.
"""

from __future__ import annotations

import sys
import time

import lance

from memwal.errors import MemWalError
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig, MergeSummary, RegionMergeResult, merge_region, merge_table
from memwal.storage import ObjectStore, lance_storage_options
from spark_jobs import common
from spark_jobs.merge_dedup import spark_dedup


def build_parser():
    p = common.job_parser("merge", "Merge flushed MemWAL generations into the base table (dedup on Spark).")
    p.add_argument("--max-generations-per-commit", type=common.positive_int,
                   default=MergeConfig.max_generations_per_commit)
    p.add_argument("--max-bytes-per-commit", type=common.byte_size, default=MergeConfig.max_bytes_per_commit,
                   help="e.g. 536870912, 512MiB, 1g")
    p.add_argument("--up-to-generation", type=common.positive_int,
                   help="merge no generation above this one (needs exactly one --region)")
    return p


def validate(parser, args) -> None:
    if args.up_to_generation is not None and len(args.regions or []) != 1:
        parser.error("--up-to-generation needs exactly one --region")


def run(spark, args) -> MergeSummary:
    config = MergeConfig(max_generations_per_commit=args.max_generations_per_commit,
                         max_bytes_per_commit=args.max_bytes_per_commit)
    so, dedup = args.storage_options, spark_dedup(spark)
    if args.up_to_generation is None:
        return merge_table(args.table, so, args.regions, config, dedup)
    # merge_table has no upper bound: the same bookkeeping for the one region.
    started, uri, region = time.monotonic(), ObjectStore(args.table, so).uri, args.regions[0]
    summary = MergeSummary(uri, table_version_before=load_index(uri, so).table_version)
    try:
        summary.regions.append(merge_region(uri, so, region, config, dedup, args.up_to_generation))
    except (MemWalError, OSError) as exc:
        summary.regions.append(RegionMergeResult(region, error=str(exc)))
    summary.table_version_after = lance.dataset(uri, storage_options=lance_storage_options(so)).version
    summary.duration_s = time.monotonic() - started
    return summary


def main(argv: list[str] | None = None) -> int:
    return common.run_job("merge", build_parser(), run, argv, validate=validate)


if __name__ == "__main__":
    sys.exit(main())
