"""`memwal`: the operator's command line over the same library the Spark jobs and Airflow run.

    memwal status TABLE                 regions (epoch, generations, backlog, age, index lag) and table health
    memwal merge TABLE [--region R]     merge due regions (--spark: through spark-submit)
    memwal catchup TABLE                bring maintained indexes up to date
    memwal snapshot TABLE               refresh the region snapshots in the MemWAL index
    memwal gc TABLE [--dry-run]         remove what no reader needs any more
    memwal compaction TABLE [--force]   compact the base table's fragments when due (--spark: tasks on executors)
    memwal retention TABLE [--dry-run]  remove base-table versions the retention policy no longer keeps
    memwal indexes list|add|drop TABLE [NAME...] [--dry-run]
                                        the MemWAL's maintained indexes (memwal.maintained_indexes)
    memwal search TABLE (--vector JSON | --text QUERY) [--k N] [--filter SQL] [--json] [--plan]
                                        the k nearest (or best-matching) live rows over the LSM view
    memwal probe TABLE_OR_ROOT [--json] which jobs are due on the table (or each table under the root), and why

Progress goes to stderr; `--json` prints the job's JSON summary to stdout. Exit status (memwal.jobs):
0 done; 1 failed, with a one-line reason; 2 bad input (one line naming the parameter and the value: a bad
argument, a missing table, an unknown region or index); 3 the job ran but some region or index failed
(summary first, then the reason); 4 `memwal status` found a lag threshold breached.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import gc
import json
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from memwal.errors import BadInputError, MemWalError, one_line
from memwal.job_config import JobOptions
from memwal.jobs import (
    EXIT_FAILED,
    EXIT_LAG_ALERT,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    JOBS,
    OneLineArgumentParser,
    add_common_arguments,
    add_job_arguments,
    check_job_input,
    failure_reason,
    job_options,
    key_value,
    non_negative_int,
    ratio_arg,
    run_job,
    seconds_arg,
    storage_options_of,
    validate_job_options,
)
from memwal.storage import is_secret_option, url_credentials

if TYPE_CHECKING:
    from memwal.table import MemWalTable

__all__ = ["main"]


# `memwal status` alert thresholds: option, the lag check's key (as in the tables file), check, when it alerts.
_THRESHOLDS = (
    ("--max-unmerged-generations", "max_unmerged_generations", non_negative_int,
     "a region has more unmerged generations"),
    ("--max-age-s", "max_oldest_unmerged_age_s", seconds_arg, "a region's oldest unmerged generation is older"),
    ("--max-index-lag", "max_index_lag", non_negative_int, "an index lags a region's merges by more generations"),
    ("--max-fragments", "max_fragments", non_negative_int, "the base table has more fragments"),
    ("--max-deleted-ratio", "max_deleted_ratio", ratio_arg, "the base table's deleted-row ratio is higher"),
    ("--max-table-versions", "max_table_versions", non_negative_int, "Lance keeps more table versions"),
    ("--max-index-segments", "max_index_segments", non_negative_int, "an index has more segments"),
    ("--max-unindexed-rows", "max_unindexed_rows", non_negative_int, "an index leaves more rows unindexed"),
)
_HEALTH_THRESHOLDS = ("--max-fragments", "--max-deleted-ratio", "--max-table-versions")  # checked on the health


def _spark_conf(text: str) -> tuple[str, str]:
    """A `--conf KEY=VALUE`; a secret (by its key, or a URL's credentials) is refused naming the key only: it
    would be on spark-submit's command line, which every user of the host can read."""
    key, value = key_value(text)
    if is_secret_option(key) or url_credentials(value):
        raise argparse.ArgumentTypeError(
            f"{key} holds a secret, and --conf goes on spark-submit's command line, which every user of the "
            "host can read: give storage credentials with --storage-options-json @FILE (they reach the job "
            "in a private file) and Spark's own secrets in spark-defaults.conf")
    return key, value


def _vector_arg(text: str) -> list[float]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--vector {text[:40]!r} is not JSON: {exc}") from exc
    if not isinstance(value, list) or not value or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in value):
        raise argparse.ArgumentTypeError(f"--vector {text[:40]!r} is not a JSON list of numbers")
    return [float(x) for x in value]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _search(args: argparse.Namespace, table: MemWalTable) -> int:
    """`memwal search`: rows nearest first (best first for --text), without the vector column unless --json."""
    from memwal.reader import LsmReader

    table.dataset  # noqa: B018 - a missing table fails here, named
    reader = LsmReader(table)
    if args.vector is not None:
        result = reader.search(args.vector, column=args.column, k=args.k, filter=args.filter)
    else:
        result = reader.full_text_search(args.text, column=args.column, k=args.k, filter=args.filter)
    if args.json:
        for row in result.to_pylist():
            print(json.dumps(row, default=str))
    else:
        import pyarrow as pa

        shown = [f.name for f in result.schema if not pa.types.is_fixed_size_list(f.type)]
        for row in result.select(shown).to_pylist():
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.plan:
        print(_plan_line(reader, args.vector is not None), file=sys.stderr)
    return EXIT_OK


def _plan_line(reader: Any, vector: bool) -> str:
    """--plan: what the search read (reader.last_vector_plan / last_fts_plan), one line for stderr."""
    p = reader.last_vector_plan if vector else reader.last_fts_plan
    what = f"vector search on {p.column} ({p.metric})" if vector else f"full-text search on {p.column} ({p.terms})"
    return (f"plan: {what}: {p.indexed_sources} source(s) through an index, {p.flat_sources} read flat, "
            f"{p.rows_served_flat} rows served flat; {p.candidates} candidates, {p.shadowed} shadowed")


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="memwal", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="per-region status of a table")
    add_common_arguments(status, "status")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    for option, key, check, when in _THRESHOLDS:
        status.add_argument(option, dest=key, type=check, default=None,
                            help=f"alert (exit {EXIT_LAG_ALERT}) when {when}")
    status.add_argument("--no-health", dest="health", action="store_false",
                        help="leave out the table's health (fragments, versions, bytes, what GC could free)")
    status.add_argument("--search", action="store_true",
                        help="also what a vector or full-text search pays now: sources per index, rows served flat "
                             "(opens every unmerged generation)")
    status.add_argument("-v", "--verbose", action="store_true")
    search = sub.add_parser("search", help="vector or full-text search over the LSM view (memwal.vector_search)")
    add_common_arguments(search, "search")
    what = search.add_mutually_exclusive_group(required=True)
    what.add_argument("--vector", type=_vector_arg, metavar="JSON", help="query vector as a JSON list of numbers")
    what.add_argument("--text", metavar="QUERY", help="full-text query")
    search.add_argument("--k", type=_positive, default=10, help="number of rows (default 10)")
    search.add_argument("--filter", default=None, metavar="SQL", help="prefilter on the newest rows, e.g. \"grp = 1\"")
    search.add_argument("--column", default=None, help="the searched column (default: the only indexed one)")
    search.add_argument("--json", action="store_true", help="print one JSON object per row")
    search.add_argument("--plan", action="store_true",
                        help="also print the read plan to stderr: sources through an index or flat, rows served flat")
    search.add_argument("-v", "--verbose", action="store_true")
    _add_probe_parser(sub)
    indexes = sub.add_parser("indexes", help="list, add or drop the MemWAL's maintained indexes")
    indexes.add_argument("action", choices=("list", "add", "drop"))
    add_common_arguments(indexes, "indexes")
    indexes.add_argument("names", nargs="*", metavar="NAME", help="base-table index names (add, drop)")
    indexes.add_argument("--dry-run", action="store_true", help="print the change (before and after); commit nothing")
    indexes.add_argument("--json", action="store_true", help="print the answer as JSON")
    indexes.add_argument("-v", "--verbose", action="store_true")
    for job in JOBS:
        p = sub.add_parser(job, help=f"run the {job} job")
        add_common_arguments(p, job)
        add_job_arguments(p, job)
        p.add_argument("--json", action="store_true", help="print the JSON summary to stdout")
        p.add_argument("--spark", action="store_true",
                       help="executor work through spark-submit (a job without any runs here: memwal.engines)")
        p.add_argument("--spark-connect", metavar="URL", default=None,
                       help="executor work through the Spark Connect server at URL (sc://HOST:PORT); the job's "
                            "driver logic runs here")
        p.add_argument("--auto", action="store_true",
                       help="with --spark or --spark-connect: run here unless the work is large (memwal.engines)")
        p.add_argument("--master", default="local[*]", help="Spark master for --spark (default local[*])")
        p.add_argument("--conf", action="append", type=_spark_conf, default=[], metavar="KEY=VALUE",
                       help="Spark configuration for --spark (repeatable), e.g. spark.pyspark.python=python3: the "
                            "executors' Python (it needs the dependencies; the code is shipped with --py-files)")
        p.add_argument("-v", "--verbose", action="store_true")
    return parser


def _add_probe_parser(sub: Any) -> None:
    """`memwal probe`: its TABLE is a table or a root (a directory, S3 prefix or LanceDB database)."""
    probe = sub.add_parser("probe", help="which maintenance jobs are due on a table, or on every table under a "
                                         "root, and why (memwal.probe)")
    add_common_arguments(probe, "probe")
    probe.add_argument("--json", action="store_true", help="print one JSON object per table")
    probe.add_argument("--merge-min-generations", type=_positive, default=1,
                       help="merge is due from this many unmerged generations (default 1)")
    probe.add_argument("--merge-max-age-s", type=seconds_arg, default=None,
                       help="or once the oldest unmerged generation is this old")
    probe.add_argument("--snapshot-max-age-s", type=seconds_arg, default=3600.0,
                       help="refresh a snapshot this old when a region moved since (default 3600)")
    probe.add_argument("-v", "--verbose", action="store_true")


def _probe(args: argparse.Namespace) -> int:
    """`memwal probe`: per table, the due jobs in the safe order with their reasons; 1 when nothing could be
    probed (an unlistable root, a failing table), 3 when some table failed."""
    from memwal.probe import ProbeEntry, ProbePolicy, probe_tables

    policy = ProbePolicy(merge_min_generations=args.merge_min_generations, merge_max_age_s=args.merge_max_age_s,
                         snapshot_max_age_s=args.snapshot_max_age_s)
    results = probe_tables([ProbeEntry(args.table, storage_options_of(args), policy)])
    for r in results:
        if args.json:
            print(json.dumps(r.to_dict(), default=str))
        elif r.status in ("ok", "error") and (r.due or r.status == "ok"):
            print(f"{r.table_uri}: " + ("; ".join(f"{d.job}: {d.reason}" for d in r.due) or "nothing due"))
        else:
            print(f"{r.table_uri}: {r.status}" + (f" ({r.error})" if r.error and r.status != "error" else ""))
        if r.status == "error":
            print(f"memwal probe: {r.error}", file=sys.stderr)
    failed = sum(r.status == "error" for r in results)
    return EXIT_OK if not failed else EXIT_FAILED if failed == len(results) else EXIT_PARTIAL


def _check_indexes_args(args: argparse.Namespace) -> None:
    """`memwal indexes`: list takes no NAME and no --dry-run; add and drop take at least one NAME."""
    if args.action == "list" and (args.names or args.dry_run):
        raise BadInputError(f"indexes list takes no {'NAME' if args.names else '--dry-run'} (got "
                            f"{' '.join(args.names) or '--dry-run'}); add or drop change the list")
    if args.action != "list" and not args.names:
        raise BadInputError(f"indexes {args.action} needs at least one index NAME (memwal indexes list TABLE "
                            "shows the table's indexes)")


def _indexes(args: argparse.Namespace, table: MemWalTable) -> int:
    """`memwal indexes list|add|drop`: the maintained set (add, drop: before and after)."""
    from memwal.maintained_indexes import add_maintained, drop_maintained, list_maintained

    if args.action == "list":
        answer = list_maintained(table)
    else:
        change = add_maintained if args.action == "add" else drop_maintained
        answer = change(table, args.names, dry_run=args.dry_run)
    out = answer.to_dict()
    if args.json:
        print(json.dumps(out, default=str))
    else:
        print_indexes(out)
    return EXIT_OK


def _maintained_line(state: dict[str, Any]) -> str:
    names = ", ".join(state["maintained"]) or "none"
    return f"[{names}]" + (" (maintain_all_indexes: every base index)" if state["maintain_all_indexes"]
                           and not state["maintained_indexes"] else "")


def print_indexes(s: dict[str, Any]) -> None:
    """`memwal indexes` without --json: the maintained set (before -> after), what is skipped, the notes."""
    after = s["after"]
    if s["action"] == "list":
        print(f"table {s['table_uri']} @ version {s['table_version']}: maintained {_maintained_line(after)}")
    else:
        done = "would change" if s["dry_run"] else "changed"
        what = (f"{done} maintained {_maintained_line(s['before'])} -> {_maintained_line(after)}" if s["changed"]
                else f"maintained {_maintained_line(after)} unchanged")
        tail = "; dry run: nothing committed" if s["dry_run"] else f" at table version {s['table_version']}"
        print(f"indexes {s['action']} on {s['table_uri']}: {what}{tail if s['changed'] else ''}")
    print(f"base indexes: {', '.join(s['base_indexes']) or 'none'}" + (
        f"; the primary key's BTREE {', '.join(s['primary_key_indexes'])} is maintained implicitly"
        if s["primary_key_indexes"] else ""))
    for name in after["not_on_base"]:
        print(f"! {name} is maintained but not on the base table: catch-up and flush skip it; remove it with "
              f"`memwal indexes drop {s['table_uri']} {name}`")
    for note in s["notes"]:
        print(f"note: {note}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with the checks across options; a bad one exits 2 with one line."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.region = list(dict.fromkeys(args.region)) if args.region else None
    try:
        if args.command in ("search", "probe"):
            pass
        elif args.command == "indexes":
            _check_indexes_args(args)
        elif args.command == "status":
            given = [(o, getattr(args, key)) for o, key, *_ in _THRESHOLDS
                     if o in _HEALTH_THRESHOLDS and getattr(args, key) is not None]
            if given and not args.health:
                raise BadInputError(f"{given[0][0]} {given[0][1]} with --no-health: the threshold needs the "
                                    "table's health; drop one of them")
        else:
            args.options = job_options(args.command, args)
            validate_job_options(args.command, args.options, args.region)
    except ValueError as exc:
        parser.exit(EXIT_USAGE, f"memwal {args.command}: error: {one_line(exc)}\n")
    return args


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def print_status(status: dict[str, Any]) -> None:
    header = ["region", "epoch", "gen", "flushed", "merged", "unmerged", "rows", "bytes", "oldest", "idx lag"]
    rows = []
    for r in status["regions"]:
        flushed = r["flushed_generations"]
        rows.append([
            r["region_id"], str(r["writer_epoch"]), str(r["current_generation"]),
            f"{flushed[0]}..{flushed[-1]}" if flushed else "-", str(r["merged_generation"]),
            str(r["unmerged_generations"]), str(r["unmerged_rows"]), _bytes(r["unmerged_bytes"]),
            _age(r["oldest_unmerged_age_s"]), str(r["index_lag_generations"]) + (" !" if r["error"] else ""),
        ])
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=False)]
    print(f"table {status['table_uri']} @ version {status['table_version']}: {len(rows)} regions, "
          f"{status['unmerged_rows']} unmerged rows, max index lag {status['max_index_lag_generations']}")
    for line in [header, *rows]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)))
    for r in status["regions"]:
        if r["error"]:
            print(f"! region {r['region_id']}: {r['error']}")
    h = status.get("health")
    if h:
        print(f"health: {h['fragments']} fragments ({h['small_fragments']} small), deleted-row ratio "
              f"{h['deleted_ratio']:.3f}, {h['table_versions']} table versions (oldest {h['oldest_table_version']}), "
              f"base {_bytes(h['base_bytes'])}, _mem_wal {_bytes(h['mem_wal_bytes'])} in {h['generation_dirs']} "
              f"generation directories")
        held = sorted(set(h["gc_limited_by"].values()))
        print(f"gc: could free {_bytes(h['gc_reclaimable_bytes'])} now"
              + (f"; held back by: {', '.join(held)}" if held else ""))
    for i in status.get("indexes") or []:
        print(f"index {i['name']} ({i['index_type']} on {', '.join(i['fields'])}): {i['segments']} segments, "
              f"{i['indexed_rows']} rows indexed in {i['indexed_fragments']} fragments, {i['unindexed_rows']} "
              f"unindexed in {i['unindexed_fragments']}")
    for c in status.get("search") or []:
        print(f"search {c['kind']} on {c['column']} ({c['index']}): {c['indexed_sources']} sources through an index, "
              f"{c['flat_sources']} flat, {c['rows_served_flat']} rows served flat")


def _summary_line(s: dict[str, Any]) -> str:
    job = s.get("job")
    if job == "merge":
        return (f"merge: {s['generations_merged']} generations in {s.get('table_commits', s['commits'])} commits "
                f"({s['commits']} region batches), "
                f"{s['rows_upserted']} upserts, {s['rows_deleted']} deletes, table version "
                f"{s['table_version_before']} -> {s['table_version_after']} ({s['duration_s']:.1f}s)")
    if job == "catchup":
        idx = ", ".join(f"{i['index_name']}{'' if i['covered'] else ' (not covered)'}"
                        + (f" (folded {i['folded_segments']} segments)" if i.get("folded_segments") else "")
                        for i in s["indexes"])
        return f"catchup: {idx or 'no maintained indexes'}; table version {s['table_version_after']}"
    if job == "snapshot":
        return (f"snapshot: {s['num_regions']} regions stored {s['storage']} ({s['bytes']} bytes) at table "
                f"version {s['table_version']}")
    if job == "gc":
        key = "would_delete" if s["dry_run"] else "deleted"
        counts = ", ".join(f"{v} {k}" for k, v in sorted(s[key].items())) or "nothing"
        return f"gc{' (dry run)' if s['dry_run'] else ''}: {key.replace('_', ' ')} {counts}, {_bytes(s['bytes'])}"
    if job == "compaction":
        if not s["compacted"]:
            return f"compaction: {'; '.join(s['due']) or 'not due'}; nothing committed" + (
                f" ({s['error']})" if s.get("error") else "") + _blocked(s)
        return (f"compaction: {'; '.join(s['due'])}: {s['tasks_committed']} tasks in {s['rounds']} rounds "
                f"({s['tasks_preempted']} preempted), fragments {s['health_before']['fragments']} -> "
                f"{s['health_after']['fragments']}, table version {s['table_version_before']} -> "
                f"{s['table_version_after']}" + _blocked(s))
    if job == "retention":
        verb = "would remove" if s["dry_run"] else "removed"
        unverified = s.get("unverified_files")
        return (f"retention{' (dry run)' if s['dry_run'] else ''}: {verb} {s['num_versions_removed']} table "
                f"versions ({_bytes(s['bytes_removed'])}); {s['num_versions_retained']} retained, oldest "
                f"{s['oldest_retained_version']}" + (
                    f"; --delete-unverified would also delete {unverified['count']} files no version references "
                    f"({_bytes(unverified['bytes'])}), e.g. {', '.join(unverified['sample'][:3]) or '-'}"
                    if unverified else ""))
    return json.dumps(s)


def _blocked(s: dict[str, Any]) -> str:
    """The indexes that keep a due compaction from combining fragments (the next catch-up lifts both)."""
    out = ""
    for key, what in (("blocked_by_index_segments", "index segments"),
                      ("blocked_by_unindexed_fragments", "fragments not indexed yet")):
        blocked = s.get(key) or {}
        if blocked:
            out += f"; still due, blocked by {what}: " + ", ".join(f"{k} ({v})" for k, v in sorted(blocked.items()))
    return out


@functools.cache
def _skip_final_collection() -> None:
    """At exit, freeze the heap instead of letting Python collect it: over lance's, pyarrow's and pandas'
    objects the interpreter's final collection takes a large share of a short job's wall time."""
    atexit.register(gc.freeze)


@contextlib.contextmanager
def start_up() -> Iterator[None]:
    """The command's start-up: lance, pyarrow and pandas imported (the first time in the process) with the
    cyclic collector off, then frozen. An import makes objects, not garbage, yet sets off a collection every
    700 allocations (about 260 of them, 0.1 s of a task's CPU); frozen, they are skipped by the job's own
    collections. A process that has them already (a test calling `main`) is left as it is."""
    if "lance" in sys.modules:
        yield
        return
    collecting = gc.isenabled()
    gc.disable()
    try:
        import memwal.table  # noqa: F401 - the point: lance, pyarrow and pandas, under the block
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    """The command's exit status (docs/jobs.md's table); bad input is one line on stderr and 2, as a status."""
    _skip_final_collection()
    try:
        args = _parse(argv)
    except SystemExit as exc:  # --help (0), or bad input already written as one line (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with start_up():
        from memwal.table import MemWalTable
    try:
        if args.command == "probe":
            return _probe(args)
        table = MemWalTable(args.table, storage_options_of(args))
        if args.command == "search":
            return _search(args, table)
        if args.command == "indexes":
            return _indexes(args, table)
        if args.command == "status":
            from memwal.lag import breaches
            from memwal.status import table_status

            check_job_input("status", table, JobOptions(), args.region)
            summary = table_status(table, args.region).to_dict()
            if args.health:
                from memwal.health import table_health

                summary["health"] = table_health(table).to_dict()
            from memwal.index_health import index_health

            summary["indexes"] = [h.to_dict() for h in index_health(table.refresh().dataset)]
            if args.search:
                from memwal.search_costs import search_costs

                summary["search"] = search_costs(table)
            alerts = [b["message"] for b in breaches(summary, {key: getattr(args, key) for _, key, *_ in _THRESHOLDS})]
            summary["alerts"] = alerts
            if args.json:
                print(json.dumps(summary, default=str))
            else:
                print_status(summary)
            for alert in alerts:
                print(f"ALERT {alert}", file=sys.stderr)
            if any(r["error"] for r in summary["regions"]):
                return EXIT_FAILED
            return EXIT_LAG_ALERT if alerts else EXIT_OK
        if args.spark or args.spark_connect:
            summary = _run_on_engine(args, table)
        else:
            summary = run_job(args.command, table, args.options, args.region)
    except BadInputError as exc:
        print(f"memwal {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (MemWalError, OSError, ValueError) as exc:
        print(f"memwal {args.command}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(summary, default=str) if args.json else _summary_line(summary))
    reason = failure_reason(summary)
    if reason:
        print(f"memwal {args.command}: {reason}", file=sys.stderr)
        return EXIT_PARTIAL
    return EXIT_OK


def _run_on_engine(args: argparse.Namespace, table: MemWalTable) -> dict[str, Any]:
    """--spark / --spark-connect (/ --auto): `memwal.engines.dispatch` plans here, then runs here, on
    spark-submit or on Spark Connect (the installed runner); the summary says where and why."""
    from memwal.engines import dispatch, load_runner

    spark_engine = "spark_connect" if args.spark_connect else "spark"
    engine = "auto" if args.auto else spark_engine
    check_job_input(args.command, table, args.options, args.region)  # before any Spark starts
    settings = {"url": args.spark_connect} if args.spark_connect else {"master": args.master, "conf": dict(args.conf)}
    runners = {spark_engine: load_runner(spark_engine, **settings)}
    return dispatch(args.command, table, args.options, args.region, engine=engine, runners=runners,
                    spark_engine=spark_engine)


if __name__ == "__main__":
    sys.exit(main())
