"""The four background jobs behind one calling convention, shared by the `memwal` command, the Spark
entry points (`spark_jobs/`) and the Airflow operators: the same arguments, summaries and exit codes.

Every job takes the table URI, storage options (`--storage-option KEY=VALUE`, repeatable, or
`--storage-options-json '{...}'` / `@FILE`) and a region selection (`--region UUID`, repeatable; default
all), plus its own options (`add_job_arguments`).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_FAILED",
    "EXIT_LAG_ALERT",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_USAGE",
    "JOBS",
    "add_common_arguments",
    "add_job_arguments",
    "byte_size",
    "failure_reason",
    "job_argv",
    "job_options",
    "parse_storage_options",
    "positive_int",
    "region_id",
    "run_job",
    "validate_job_arguments",
]

log = logging.getLogger(__name__)

JOBS = ("merge", "catchup", "snapshot", "gc", "compaction", "retention")

# Exit statuses of `memwal` and of every spark_jobs entry point.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL, EXIT_LAG_ALERT = 0, 1, 2, 3, 4


def region_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"region id {text!r} is not a UUID") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def byte_size(text: str) -> int:
    """Bytes from `536870912`, `512MiB`, `512m`, `1g`, `1GB` (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 536870912, 512MiB, 1g)")
    value = int(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not >= 1 byte")
    return value


def parse_storage_options(pairs: list[str] | None, as_json: str | None = None) -> dict[str, str] | None:
    """`KEY=VALUE` pairs over a JSON object (or `@FILE` holding one, which keeps secrets off argv)."""
    out: dict[str, str] = {}
    if as_json:
        try:
            text = Path(as_json[1:]).read_text() if as_json.startswith("@") else as_json
            data = json.loads(text)
        except (OSError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"--storage-options-json: {exc}") from exc
        if not isinstance(data, dict):
            raise argparse.ArgumentTypeError("--storage-options-json must be a JSON object")
        out.update({str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in data.items()})
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"--storage-option {pair!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out or None


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("table", help="table URI: a path, file://... or s3://bucket/prefix")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="storage option as Lance takes it (repeatable), e.g. aws_endpoint=http://...")
    parser.add_argument("--storage-options-json", default=None, metavar="JSON",
                        help="storage options as one JSON object, or @FILE; --storage-option entries override it")
    parser.add_argument("--region", action="append", type=region_id, default=None, metavar="UUID",
                        help="limit to this region (repeatable; default: all regions)")


def add_job_arguments(parser: argparse.ArgumentParser, job: str) -> None:
    """The options of one job (besides the common ones)."""
    if job == "merge":
        parser.add_argument("--max-generations-per-commit", type=positive_int, default=8)
        parser.add_argument("--max-bytes-per-commit", type=byte_size, default=512 * 1024 * 1024,
                            help="e.g. 536870912, 512MiB, 1g")
        parser.add_argument("--up-to-generation", type=positive_int, default=None,
                            help="merge no generation above this one (needs exactly one --region)")
    elif job == "catchup":
        parser.add_argument("--index", action="append", default=None, metavar="NAME",
                            help="only this base-table index (repeatable; default: every maintained index)")
    elif job == "snapshot":
        parser.add_argument("--inline-threshold", type=int, default=100,
                            help="store snapshots inline up to this many regions, else as index.lance")
    elif job == "gc":
        parser.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
        parser.add_argument("--keep-manifest-versions", type=positive_int, default=10)
        parser.add_argument("--grace-period-s", type=float, default=3600.0,
                            help="age after which an unlisted generation directory counts as a failed flush")
    elif job == "compaction":
        from memwal.maintenance_config import CompactionConfig

        d = CompactionConfig()
        parser.add_argument("--target-rows-per-fragment", type=positive_int, default=d.target_rows_per_fragment)
        parser.add_argument("--materialize-deletions-threshold", type=_ratio,
                            default=d.materialize_deletions_threshold,
                            help="rewrite a fragment whose deleted-row share exceeds this")
        parser.add_argument("--max-fragments", type=positive_int, default=d.max_fragments,
                            help="due when the table has more fragments")
        parser.add_argument("--max-small-fragments", type=positive_int, default=d.max_small_fragments,
                            help="due when this many fragments hold under half the target rows")
        parser.add_argument("--max-deleted-ratio", type=_ratio, default=d.max_deleted_ratio,
                            help="due when the share of deleted rows reaches this")
        parser.add_argument("--max-tasks-per-round", type=positive_int, default=d.max_tasks_per_round,
                            help="commit at most this many tasks per round (bounds how long merges wait)")
        parser.add_argument("--force", action="store_true", help="compact even when not due")
        parser.add_argument("--no-lock", dest="use_lock", action="store_false",
                            help="do not hold the MemWAL index lock (merges may then preempt a round)")
    elif job == "retention":
        from memwal.maintenance_config import RetentionConfig

        d = RetentionConfig()
        parser.add_argument("--older-than-s", type=_seconds, default=d.older_than_s,
                            help="remove table versions older than this many seconds (default 7 days)")
        parser.add_argument("--keep-versions", type=positive_int, default=d.keep_versions,
                            help="always keep the newest N table versions")
        parser.add_argument("--delete-unverified", action="store_true",
                            help="also remove unreferenced files younger than 7 days (no other writer running!)")
        parser.add_argument("--dry-run", action="store_true", help="list versions and bytes, remove nothing")
    else:
        raise ValueError(f"unknown job {job!r}; expected one of {JOBS}")


def _number_in(low: float, high: float | None = None) -> Callable[[str], float]:
    """An argparse type: a number in [low, high] (no upper bound when high is None)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is not between {low:g} and {high:g}" if high is not None
                                             else f"{value} is not >= {low:g}")
        return value

    return parse


_ratio, _seconds = _number_in(0, 1), _number_in(0)


def job_argv(job: str, values: argparse.Namespace | dict[str, Any]) -> list[str]:
    """The job-specific options among values (a Namespace or a dict keyed by option dest) as argv, the
    inverse of add_job_arguments; options at their default are left out."""
    values = vars(values) if isinstance(values, argparse.Namespace) else dict(values)
    parser = argparse.ArgumentParser(add_help=False)
    add_job_arguments(parser, job)
    argv: list[str] = []
    for action in parser._actions:
        value = values.get(action.dest, action.default)
        if value is None or value == action.default or not action.option_strings:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            argv.append(flag)
        elif isinstance(action, argparse._AppendAction):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def validate_job_arguments(job: str, args: argparse.Namespace) -> None:
    """Checks across options; raises ArgumentTypeError with a one-line reason."""
    if job == "merge" and args.up_to_generation is not None and len(args.region or []) != 1:
        raise argparse.ArgumentTypeError("--up-to-generation needs exactly one --region")


def job_options(args: argparse.Namespace) -> dict[str, str] | None:
    return parse_storage_options(args.storage_option, args.storage_options_json)


def run_job(job: str, args: argparse.Namespace, *, dedup: Callable | None = None,
            read_manifests: Callable | None = None, execute: Callable | None = None) -> dict[str, Any]:
    """Run one job in this process; returns its JSON-ready summary. Spark passes its own hooks (dedup,
    read_manifests, and execute: where compaction tasks run)."""
    validate_job_arguments(job, args)
    from memwal.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the job's first Lance work: memory follows one commit, not their number
    options = job_options(args)
    regions = list(dict.fromkeys(args.region)) if args.region else None
    if job == "merge":
        from memwal.merge import MergeConfig, local_dedup, merge_table

        config = MergeConfig(max_generations_per_commit=args.max_generations_per_commit,
                             max_bytes_per_commit=args.max_bytes_per_commit)
        return merge_table(args.table, options, regions, config, dedup or local_dedup,
                           up_to_generation=args.up_to_generation).to_dict()
    if job in ("catchup", "snapshot", "compaction", "retention") and regions:
        log.warning("--region is ignored: %s always covers the whole table", job)
    if job == "catchup":
        from memwal.catchup import catchup_table

        return catchup_table(args.table, options, index_names=args.index).to_dict()
    if job == "snapshot":
        from memwal.snapshot import read_manifests_threaded, refresh_snapshot

        return refresh_snapshot(args.table, options, inline_threshold=args.inline_threshold,
                                read_manifests=read_manifests or read_manifests_threaded).to_dict()
    if job == "gc":
        from memwal.gc import GcConfig, gc_table

        config = GcConfig(keep_manifest_versions=args.keep_manifest_versions,
                          grace_period_s=args.grace_period_s, dry_run=args.dry_run)
        return gc_table(args.table, options, regions, config).to_dict()
    if job == "compaction":
        from memwal.compaction import compact_table, execute_in_process
        from memwal.maintenance_config import CompactionConfig

        config = CompactionConfig(
            target_rows_per_fragment=args.target_rows_per_fragment,
            materialize_deletions_threshold=args.materialize_deletions_threshold,
            max_fragments=args.max_fragments, max_small_fragments=args.max_small_fragments,
            max_deleted_ratio=args.max_deleted_ratio, max_tasks_per_round=args.max_tasks_per_round,
            force=args.force, use_lock=args.use_lock)
        return compact_table(args.table, options, config, execute or execute_in_process).to_dict()
    if job == "retention":
        from memwal.maintenance_config import RetentionConfig
        from memwal.retention import retain_versions

        config = RetentionConfig(older_than_s=args.older_than_s, keep_versions=args.keep_versions,
                                 delete_unverified=args.delete_unverified, dry_run=args.dry_run)
        return retain_versions(args.table, options, config).to_dict()
    raise ValueError(f"unknown job {job!r}; expected one of {JOBS}")


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
