"""The six background jobs (merge, catch-up, snapshot, GC, compaction, retention: `JOBS`) behind one calling
convention, shared by the `memwal` command, the Spark entry points (`spark_jobs/`) and the Airflow operators:
the same options, summaries and exit codes.

In process, a job is `run_job(job, table handle, JobOptions, regions)`: typed, no argv. Argv is parsed only
where it arrives (the CLI and the Spark entry points): the table URI, storage options (`--storage-option
KEY=VALUE`, repeatable, or `--storage-options-json '{...}'` / `@FILE`), a region selection (`--region UUID`,
repeatable; default all; only merge, gc and status take one) and the job's own options (`add_job_arguments`,
read back by `job_options`). Bad input is one contract everywhere: a value is checked by `memwal.option_values`
at parse time, what needs the table (an unknown region or index, a missing table) by `check_job_input` before
the job starts; both raise BadInputError, exit status 2 with one line naming the parameter and the value.
"""

from __future__ import annotations

import argparse
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from memwal import option_values
from memwal.errors import BadInputError
from memwal.job_config import JobOptions
from memwal.job_specs import spec

if TYPE_CHECKING:
    from memwal.table import MemWalTable

__all__ = [
    "EXIT_FAILED",
    "EXIT_LAG_ALERT",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "JOBS",
    "REGION_JOBS",
    "OneLineArgumentParser",
    "TableJobs",
    "add_common_arguments",
    "add_job_arguments",
    "byte_size",
    "check_job_input",
    "check_regions",
    "failure_reason",
    "job_options",
    "key_value",
    "non_negative_int",
    "positive_int",
    "ratio_arg",
    "region_id",
    "run_job",
    "seconds_arg",
    "storage_options_of",
    "validate_job_options",
]

log = logging.getLogger(__name__)

JOBS = ("merge", "catchup", "snapshot", "gc", "compaction", "retention")

# Exit statuses of `memwal` and of every spark_jobs entry point.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL, EXIT_LAG_ALERT = 0, 1, 2, 3, 4


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), not the usage block."""

    error_line: str | None = None  # the last usage error (for a caller that reports it elsewhere too)

    def error(self, message: str) -> NoReturn:
        self.error_line = f"{self.prog}: error: {' '.join(message.split())}"
        self.exit(EXIT_USAGE, self.error_line + "\n")


def region_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"region id {text!r} is not a UUID") from None


positive_int = option_values.count_arg
byte_size = option_values.byte_size_arg
non_negative_int = option_values.non_negative_arg
ratio_arg = option_values.ratio_arg
seconds_arg = option_values.seconds_arg


def key_value(text: str) -> tuple[str, str]:
    """A `KEY=VALUE` argument (`--storage-option`, `--conf`)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _storage_options_json(text: str) -> dict[str, str]:
    """A `--storage-options-json` argument: a JSON object, or @FILE holding one (secrets stay off argv)."""
    try:
        data = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(" ".join(str(exc).split())) from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{text if text.startswith('@') else 'the value'} is not a JSON object")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in data.items()}


REGION_JOBS = ("status", "merge", "gc")  # what takes --region; the other jobs always cover the whole table


def add_common_arguments(parser: argparse.ArgumentParser, job: str) -> None:
    """The table, its storage options and (for the jobs in REGION_JOBS) the region selection."""
    parser.add_argument("table", help="table URI: a path, file://... or s3://bucket/prefix")
    parser.add_argument("--storage-option", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                        help="storage option as Lance takes it (repeatable), e.g. aws_endpoint=http://...")
    parser.add_argument("--storage-options-json", type=_storage_options_json, default=None, metavar="JSON",
                        help="storage options as one JSON object, or @FILE; --storage-option entries override it")
    if job in REGION_JOBS:
        parser.add_argument("--region", action="append", type=region_id, default=None, metavar="UUID",
                            help="limit to this region (repeatable; default: all regions)")
    else:
        parser.add_argument("--region", action="append", type=_no_region(job), default=None, help=argparse.SUPPRESS)


def _no_region(job: str) -> Callable[[str], str]:
    def refuse(text: str) -> str:
        raise argparse.ArgumentTypeError(f"{text!r}: {job} always covers the whole table; it takes no --region")

    return refuse


def add_job_arguments(parser: argparse.ArgumentParser, job: str) -> None:
    """The options of one job (besides the common ones), derived from its spec (`memwal.job_specs`)."""
    spec(job).add_arguments(parser)


def job_options(job: str, args: argparse.Namespace) -> JobOptions:
    """The typed options of a parsed command line (the CLI's and the Spark entry points')."""
    return spec(job).from_args(args)


def validate_job_options(job: str, options: JobOptions, regions: Sequence[str] | None) -> None:
    """Checks across options (no I/O); raises BadInputError with a one-line reason naming the parameters."""
    if job not in REGION_JOBS and regions:
        raise BadInputError(f"--region {regions[0]}: {job} always covers the whole table; it takes no --region")
    if job == "merge" and options.up_to_generation is not None and len(regions or []) != 1:
        raise BadInputError(f"--up-to-generation {options.up_to_generation} needs exactly one --region "
                            f"(got {len(regions or [])})")


def check_regions(table: MemWalTable, regions: Sequence[str], *, param: str = "--region",
                  where: str | None = None) -> list[str]:
    """The canonical ids of the given regions, duplicates dropped; BadInputError naming the parameter, a
    malformed id or one the table does not have, and the table (`where`, default its URI). The one region
    check of `memwal`, the Spark entry points and the Airflow hook."""
    where = where or f"table {table.uri}"
    known = set(table.regions())
    out = []
    for region in regions:
        try:
            rid = str(uuid.UUID(str(region).strip()))
        except ValueError:
            raise BadInputError(f"{param}: region id {region!r} is not a UUID ({where})") from None
        if rid not in known:
            raise BadInputError(f"{param} {rid}: no such region in {where} ({len(known)} regions; list them with "
                                "`memwal status TABLE`)")
        out.append(rid)
    return list(dict.fromkeys(out))


def check_job_input(job: str, table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> None:
    """What the table must have for the job's input: it exists (TableNotFoundError), every selected region
    exists and, for catch-up, every named index. BadInputError naming the region or index and the table."""
    validate_job_options(job, options, regions)
    table.dataset  # noqa: B018 - a missing table fails here, named
    if regions and job in REGION_JOBS:
        check_regions(table, regions)
    if job == "catchup" and options.indexes:
        from memwal import naming

        names = sorted(d.name for d in table.dataset.describe_indices() if d.name != naming.MEM_WAL_INDEX_NAME)
        for name in options.indexes:
            if name not in names:
                raise BadInputError(f"--index {name!r}: no such index in table {table.uri} (its indexes: "
                                    f"{', '.join(names) or 'none'})")


def storage_options_of(args: argparse.Namespace) -> dict[str, str] | None:
    """The storage options of a parsed command line (--storage-option over --storage-options-json)."""
    out = dict(args.storage_options_json or {})
    out.update(args.storage_option or [])
    return out or None


def run_job(job: str, table: MemWalTable, options: JobOptions | None = None, regions: Sequence[str] | None = None,
            *, dedup: Callable | None = None, read_manifests: Callable | None = None,
            execute: Callable | None = None, runner: Callable | None = None, parallelism: int = 1,
            distributed: Any = None) -> dict[str, Any]:
    """Run one job on the table in this process; returns its JSON-ready summary. Spark passes its own hooks
    (dedup, read_manifests, execute: where compaction tasks run, runner / parallelism: where and in how many
    tasks the merge's fragment apply runs, and distributed: catch-up's `memwal.catchup.DistributedBuild`,
    where index segments are built)."""
    options = options or JobOptions()
    regions = list(dict.fromkeys(regions)) if regions else None
    check_job_input(job, table, options, regions)
    from memwal.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the job's first Lance work: memory follows one commit, not their number
    return spec(job).run(table, options, regions, dedup=dedup, read_manifests=read_manifests, execute=execute,
                         runner=runner, parallelism=parallelism, distributed=distributed)


class TableJobs:
    """A table's jobs bound to its handle (`MemWalTable.jobs`), each returning its JSON-ready summary."""

    def __init__(self, table: MemWalTable):
        self.table = table

    def run(self, job: str, options: JobOptions | None = None, regions: Sequence[str] | None = None,
            **hooks: Callable) -> dict[str, Any]:
        return run_job(job, self.table, options, regions, **hooks)

    def status(self, regions: Sequence[str] | None = None) -> dict[str, Any]:
        from memwal.status import table_status

        return table_status(self.table, regions).to_dict()


def failure_reason(summary: dict[str, Any]) -> str | None:
    """One line naming what failed when the summary reports failed regions or indexes, else None."""
    if summary.get("job") == "compaction" and summary.get("error"):
        return str(summary["error"])
    for key, items, name_key, noun in (("failed_regions", "regions", "region_id", "region(s)"),
                                       ("failed_indexes", "indexes", "index_name", "index(es)")):
        failed = summary.get(key) or []
        if not failed:
            continue
        entries = [e for e in summary.get(items, []) if isinstance(e, dict)]
        errors = {e.get(name_key): e.get("error") for e in entries}
        parts = [f"{name}: {' '.join(str(errors.get(name) or 'not done').split())}" for name in failed]
        return f"{len(failed)} of {len(entries) or len(failed)} {noun} failed: " + "; ".join(parts)
    return None
