"""The due jobs of a batch of tables in one Spark application (`memwal.fleet_batch`): one SparkSession, each
table's jobs in the safe order through the jobs' own entry points (`run(spark, table, options, regions)`),
each table's failure isolated and reported.

    spark-submit [spark options] /abs/path/spark_jobs/fleet.py BATCH.json [--storage-options-json @FILE]

BATCH.json: `memwal.fleet_batch.batch_to_json` (table URIs, their jobs and non-default options; no secrets).
The storage options, one set for the whole batch (the connection's), arrive as for every job: a private file
named by `--storage-options-json @FILE`, never on the command line. Prints one JSON line per table as it is
done (`table_uri`, `status`, `failed_job`, `error`, ...: docs/jobs.md), then the batch's summary as the last
line (`job: fleet`, `tables[]`, `failed_tables`, the Spark keys); `$MEMWAL_RESULT_FILE` gets the summary as
every job writes it. Exit 0: every table done; 3: some table failed (the others ran); 2: a bad batch file
or argument (nothing ran); 1: the application itself failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwal import errors, jobs
from memwal.fleet_batch import batch_from_json, batch_summary, run_batch
from spark_jobs import common

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

log = logging.getLogger("spark_jobs.fleet")

DESCRIPTION = "Run the due jobs of a batch of tables in one Spark application."


def on_session(spark: Any) -> Any:
    """A `memwal.fleet_batch.RunOne` running each job through its entry point on `spark` (classic or Connect)."""
    from spark_jobs.connect import run_on_session

    def run_one(job: str, table: MemWalTable, options: JobOptions) -> dict[str, Any]:
        common.set_job_description(spark, f"memwal fleet: {job} {table.uri}")
        return run_on_session(job, spark, table, options, None)

    return run_one


def run(spark: Any, batch: Sequence[Any], storage_options: Mapping[str, str] | None = None,
        on_result: Any = None) -> list[dict[str, Any]]:
    """The batch (`batch_from_json`'s entries) on `spark`: one result per table (`memwal.fleet_batch.run_table`)."""
    from memwal.table import MemWalTable

    opts = dict(storage_options or {}) or None
    return run_batch(batch, on_session(spark), open_table=lambda uri: MemWalTable(uri, opts), on_result=on_result)


def parser() -> argparse.ArgumentParser:
    p = jobs.OneLineArgumentParser(prog="memwal-fleet", description=DESCRIPTION)
    p.add_argument("batch", help="the batch file (memwal.fleet_batch.batch_to_json)")
    p.add_argument("--storage-option", action="append", type=jobs.key_value, default=[], metavar="KEY=VALUE")
    p.add_argument("--storage-options-json", type=jobs._storage_options_json, default=None, metavar="JSON",
                   help="the batch's storage options as one JSON object, or @FILE (keeps secrets off argv)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=common.LOG_LEVELS)
    p.add_argument("--spark-log-level", default="WARN", type=str.upper, choices=common.SPARK_LOG_LEVELS)
    return p


def main(argv: list[str] | None = None) -> int:
    code, summary, error = _main(argv)
    common.write_result(code, summary, error)
    return code


def _main(argv: list[str] | None) -> tuple[int, dict | None, str | None]:
    prefix = "memwal-fleet"
    p = parser()
    with common.Streams() as streams:
        try:
            args = p.parse_args(argv)
            batch = batch_from_json(Path(args.batch).read_text())
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else common.EXIT_USAGE
            return code, None, None if code == common.EXIT_OK else (getattr(p, "error_line", None) or "bad arguments")
        except (OSError, errors.BadInputError) as exc:
            reason = errors.one_line(exc, 1000)
            print(f"{prefix}: error: {reason}", file=sys.stderr, flush=True)
            return common.EXIT_USAGE, None, reason
        handler = common.start_logging(args.log_level)
        storage_options = jobs.storage_options_of(args)
        spark, owned = None, False
        started = time.monotonic()
        try:
            log.info("%s: %d table(s)", prefix, len(batch))
            spark, owned = common.build_spark("fleet", spark_log_level=args.spark_log_level)
            session_s = time.monotonic() - started
            sc = spark.sparkContext
            master, app_id = sc.master, sc.applicationId  # read before the session stops
            log.info("%s: Spark %s, master %s, application %s", prefix, spark.version, master, app_id)
            results = run(spark, batch, storage_options,
                          on_result=lambda r: streams.emit(json.dumps(r, default=str)))
        except Exception as exc:
            log.debug("%s failed", prefix, exc_info=True)
            common.stop_spark(spark, owned)
            print(f"{prefix}: error: {common.one_line(exc)}", file=sys.stderr, flush=True)
            logging.getLogger().removeHandler(handler)
            return common.EXIT_FAILED, None, common.one_line(exc)
        common.stop_spark(spark, owned)
        summary = batch_summary(results, time.monotonic() - started)
        summary.update(spark_master=master, spark_application_id=app_id,
                       spark_session_s=round(session_s, 3))
        failed = summary["failed_tables"]
        logging.getLogger().removeHandler(handler)
        streams.emit(json.dumps(summary, default=str))
        if failed:
            reason = f"{len(failed)} of {len(results)} table(s) failed: " + "; ".join(
                r["error"] for r in results if r["status"] != "ok")
            print(f"{prefix}: error: {errors.one_line(reason, 2000)}", file=sys.stderr, flush=True)
            return common.EXIT_PARTIAL, summary, reason
        return common.EXIT_OK, summary, None


if __name__ == "__main__":
    sys.exit(main())
