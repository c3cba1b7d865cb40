"""Due work of many small tables shared by one Spark application: each table's due jobs (`TableDue`, built
from a probe result by `from_probe`), packed by the bytes they touch into application-sized batches
(`pack_batches`), and a batch run table by table in one engine's session (`run_batch`), each table's jobs in
the safe order and each table's failure its own result, never the batch's.

Why: a spark-submit application costs 13-18 s of start-up before any work; twenty small tables with two due
jobs each paid that forty times. A batch pays it once, and a table with nothing due starts no Spark at all
(`from_probe` returns None for it). The batch's file format (`batch_to_json` / `batch_from_json`) is what
`spark_jobs/fleet.py` reads: table URIs, jobs and their non-default options, never storage options (they
reach the driver in their own private file, as for every job).

Nothing here imports Spark or Airflow: the caller passes the function that runs one job (`RunOne`).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memwal.due_rules import JOB_ORDER
from memwal.errors import BadInputError, one_line
from memwal.job_config import JobOptions
from memwal.option_values import count

if TYPE_CHECKING:
    from memwal.probe import ProbeResult
    from memwal.table import MemWalTable

__all__ = [
    "BATCH_FORMAT",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_BATCH_TABLES",
    "DRIVER_ONLY_JOBS",
    "RunOne",
    "TableDue",
    "batch_from_json",
    "batch_summary",
    "batch_to_json",
    "due_bytes",
    "from_probe",
    "in_process",
    "pack_batches",
    "run_batch",
    "run_table",
]

log = logging.getLogger(__name__)

BATCH_FORMAT = 1  # the batch file's `format`
# One application's share of work: beyond these the batch is split (a large table gets an application alone).
DEFAULT_MAX_BATCH_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_BATCH_TABLES = 50

# Jobs whose work is the driver's alone on every engine (memwal.engines): a table with only these due needs no Spark.
DRIVER_ONLY_JOBS = ("retention", "gc")

# The due figures that are bytes the job reads or removes (memwal.due_rules): merge's unmerged generations,
# GC's collectable files. The other jobs' figures are not bytes; they count as nothing here.
_BYTE_FIGURES = {"merge": "bytes", "gc": "bytes"}


@dataclass(frozen=True)
class TableDue:
    """One table's due jobs, in the safe order (`memwal.due_rules.JOB_ORDER`), with the options they run with
    and the bytes they touch (what `pack_batches` packs by). `group`: tables of different groups never share a
    batch (e.g. their storage connection: a batch has one set of storage options). `name`: for messages."""

    uri: str
    jobs: tuple[str, ...]
    bytes: int = 0
    options: JobOptions = field(default_factory=JobOptions)
    name: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        unknown = [j for j in self.jobs if j not in JOB_ORDER]
        if unknown:
            raise BadInputError(f"table {self.uri}: job {unknown[0]!r} is not one of {', '.join(JOB_ORDER)}")
        if len(set(self.jobs)) != len(self.jobs):
            raise BadInputError(f"table {self.uri}: a job is listed twice in {list(self.jobs)}")
        object.__setattr__(self, "jobs", tuple(sorted(self.jobs, key=JOB_ORDER.index)))  # the safe order
        if isinstance(self.bytes, bool) or not isinstance(self.bytes, int) or self.bytes < 0:
            raise BadInputError(f"table {self.uri}: bytes {self.bytes!r} is not a non-negative integer")

    @property
    def needs_spark(self) -> bool:
        """Whether some due job has executor work to give Spark (not only GC and retention, driver-only)."""
        return any(j not in DRIVER_ONLY_JOBS for j in self.jobs)

    @property
    def what(self) -> str:
        return f"table {self.name!r} ({self.uri})" if self.name else f"table {self.uri}"


def due_bytes(due: Iterable[Any]) -> int:
    """The bytes a table's due jobs (`memwal.due_rules.DueJob`s) touch, from the probe's figures."""
    return sum(int(d.figures.get(_BYTE_FIGURES[d.job]) or 0) for d in due if d.job in _BYTE_FIGURES)


def from_probe(result: ProbeResult, options: JobOptions | None = None, *, group: str | None = None) -> TableDue | None:
    """The table's due work from its probe result (None: nothing due, or the probe failed: no Spark for it).
    `options`: the table's job options (its tables-file entry), default the jobs' defaults."""
    if result.status != "ok" or not result.due:
        return None
    return TableDue(result.table_uri, tuple(result.jobs), due_bytes(result.due), options or JobOptions(),
                    name=result.name, group=group)


def pack_batches(entries: Iterable[TableDue], *, max_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                 max_tables: int = DEFAULT_MAX_BATCH_TABLES) -> list[list[TableDue]]:
    """The tables with due jobs packed into batches, one Spark application each: first-fit decreasing by bytes,
    each batch at most `max_bytes` (a table larger than that alone) and `max_tables` tables, within one group.
    Tables with no due job are left out. Deterministic: equal bytes keep the given order."""
    for name, value in (("max_bytes", max_bytes), ("max_tables", max_tables)):
        try:
            count(value)
        except BadInputError as exc:
            raise BadInputError(f"pack_batches {name}: {exc}") from None
    todo = sorted((e for e in entries if e.jobs), key=lambda e: -e.bytes)  # stable: ties keep their order
    batches: list[list[TableDue]] = []
    totals: list[int] = []
    for entry in todo:
        for i, batch in enumerate(batches):
            if (batch[0].group == entry.group and len(batch) < max_tables
                    and totals[i] + entry.bytes <= max_bytes):
                batch.append(entry)
                totals[i] += entry.bytes
                break
        else:
            batches.append([entry])
            totals.append(entry.bytes)
    return batches


# --- the batch file (what spark_jobs/fleet.py reads) ------------------------------------------------------


def batch_to_json(entries: Sequence[TableDue]) -> str:
    """The batch as the fleet entry point reads it: per table its URI, name, bytes and jobs, each job with its
    non-default options as the job's command line takes them (`JobOptions.argv`). No storage options."""
    tables = [{"uri": e.uri, "name": e.name, "bytes": e.bytes,
               "jobs": [{"job": j, "args": e.options.argv(j)} for j in e.jobs]} for e in entries]
    return json.dumps({"format": BATCH_FORMAT, "tables": tables})


def batch_from_json(text: str) -> list[tuple[TableDue, dict[str, JobOptions]]]:
    """The batch file read back: each table and the options of each of its jobs (parsed as the job's command
    line parses them). BadInputError naming the table and the job for anything malformed."""
    from memwal.jobs import OneLineArgumentParser, add_common_arguments, add_job_arguments, job_options

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadInputError(f"batch file: not JSON ({one_line(exc, 200)})") from None
    if not isinstance(data, dict) or data.get("format") != BATCH_FORMAT or not isinstance(data.get("tables"), list):
        raise BadInputError(f"batch file: expected {{\"format\": {BATCH_FORMAT}, \"tables\": [...]}}")
    out = []
    for i, t in enumerate(data["tables"]):
        if not isinstance(t, dict) or not isinstance(t.get("uri"), str) or not isinstance(t.get("jobs"), list):
            raise BadInputError(f"batch file: tables[{i}] needs a string uri and a list of jobs")
        per_job: dict[str, JobOptions] = {}
        for j in t["jobs"]:
            job, args = (j.get("job"), j.get("args") or []) if isinstance(j, dict) else (None, None)
            if job not in JOB_ORDER or not isinstance(args, list):
                raise BadInputError(f"batch file: table {t['uri']}: bad job entry {j!r}")
            parser = OneLineArgumentParser(prog=f"batch file: table {t['uri']}: {job}", exit_on_error=False)
            add_common_arguments(parser, job)
            add_job_arguments(parser, job)
            try:
                per_job[job] = job_options(job, parser.parse_args([t["uri"], *map(str, args)]))
            except (argparse.ArgumentError, SystemExit, ValueError) as exc:
                raise BadInputError(f"batch file: table {t['uri']}: {job}: {one_line(exc)}") from None
        entry = TableDue(t["uri"], tuple(per_job), int(t.get("bytes") or 0), name=t.get("name"))
        out.append((entry, per_job))
    return out


# --- running a batch ---------------------------------------------------------------------------------------

# Runs one job of one table (an engine's: in process, or on a Spark session), returns its JSON-ready summary.
RunOne = Callable[[str, "MemWalTable", JobOptions], dict[str, Any]]


def in_process(job: str, table: MemWalTable, options: JobOptions) -> dict[str, Any]:
    """The in-process `RunOne`: the job in this process (`memwal.jobs.run_job`, whole table)."""
    from memwal.jobs import run_job

    return run_job(job, table, options)


def run_table(entry: TableDue, table: MemWalTable, run_one: RunOne,
              options: Mapping[str, JobOptions] | None = None) -> dict[str, Any]:
    """The table's due jobs in the safe order on `run_one`. The first job that raises, or that reports failed
    regions or indexes (`memwal.jobs.failure_reason`), stops the table's later jobs (they wait for what it
    did: GC for the merge and catch-up): the result names the job and the error and lists the skipped ones."""
    from memwal.jobs import failure_reason

    started = time.monotonic()
    result: dict[str, Any] = {"table_uri": entry.uri, "name": entry.name, "jobs": list(entry.jobs), "ran": [],
                              "status": "ok", "failed_job": None, "error": None, "skipped": [],
                              "bytes": entry.bytes, "summaries": {}}
    for i, job in enumerate(entry.jobs):
        opts = (options or {}).get(job, entry.options)
        try:
            summary = run_one(job, table, opts)
        except Exception as exc:  # this table's failure is its result; the batch goes on with the next table
            log.warning("fleet batch: %s: %s failed: %s", entry.what, job, one_line(exc))
            result.update(status="failed", failed_job=job, error=f"{entry.what}: {job}: {one_line(exc)}",
                          skipped=list(entry.jobs[i + 1:]))
            break
        result["ran"].append(job)
        result["summaries"][job] = summary
        reason = failure_reason(summary)
        if reason:
            result.update(status="partial", failed_job=job, error=f"{entry.what}: {job}: {reason}",
                          skipped=list(entry.jobs[i + 1:]))
            break
    result["duration_s"] = round(time.monotonic() - started, 3)
    return result


def run_batch(entries: Sequence[TableDue | tuple[TableDue, Mapping[str, JobOptions]]], run_one: RunOne, *,
              open_table: Callable[[str], MemWalTable],
              on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every table's due jobs (`run_table`), one table after the other, on one engine (`run_one`: e.g. the
    jobs' Spark entry points on one session). `open_table(uri)`: the table's handle (with the batch's storage
    options); a table that cannot be opened is a failed result like a job that raised. One result per table,
    in the given order; `on_result` is told each as it is done (the entry point prints it at once)."""
    results = []
    for item in entries:
        entry, options = item if isinstance(item, tuple) else (item, None)
        try:
            table = open_table(entry.uri)
        except Exception as exc:
            result = {"table_uri": entry.uri, "name": entry.name, "jobs": list(entry.jobs), "ran": [],
                      "status": "failed", "failed_job": entry.jobs[0] if entry.jobs else None,
                      "error": f"{entry.what}: {one_line(exc)}", "skipped": list(entry.jobs[1:]),
                      "bytes": entry.bytes, "summaries": {}, "duration_s": 0.0}
        else:
            result = run_table(entry, table, run_one, options)
        results.append(result)
        if on_result is not None:
            on_result(result)
    failed = [r["table_uri"] for r in results if r["status"] != "ok"]
    log.info("fleet batch: %d table(s), %d job(s) run, %d table(s) failed", len(results),
             sum(len(r["ran"]) for r in results), len(failed))
    return results


def batch_summary(results: Sequence[Mapping[str, Any]], duration_s: float) -> dict[str, Any]:
    """A batch's JSON summary (docs/jobs.md, row fleet; an engine adds its own keys): the tables' results, the
    failed ones' URIs and the jobs run."""
    return {"job": "fleet", "tables": list(results),
            "failed_tables": [r["table_uri"] for r in results if r["status"] != "ok"],
            "jobs_run": sum(len(r["ran"]) for r in results), "duration_s": round(duration_s, 3)}
