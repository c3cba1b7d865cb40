"""The four background jobs behind one calling convention, shared by the `memwal` command, the Spark
entry points and (later) the Airflow operators: the same arguments and the same JSON summaries.

Every job takes the table URI, storage options (`--storage-option KEY=VALUE`, repeatable) and a
region selection (`--region ID`, repeatable; default all), plus its own options below.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["JOBS", "add_common_arguments", "add_job_arguments", "parse_storage_options", "run_job"]

JOBS = ("merge", "catchup", "snapshot", "gc")


def parse_storage_options(pairs: Sequence[str] | None, as_json: str | None = None) -> dict[str, str] | None:
    """`KEY=VALUE` pairs (and/or a JSON object) as the storage options Lance and obstore take."""
    out: dict[str, str] = {}
    if as_json:
        try:
            out.update({str(k): str(v) for k, v in json.loads(as_json).items()})
        except (ValueError, AttributeError) as exc:
            raise argparse.ArgumentTypeError(f"--storage-options-json is not a JSON object: {exc}") from exc
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--storage-option {pair!r} is not KEY=VALUE")
        out[key] = value
    return out or None


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("table", help="table URI: a path, file://... or s3://bucket/prefix")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="storage option as Lance takes it (repeatable), e.g. aws_endpoint=http://...")
    parser.add_argument("--storage-options-json", default=None, help="storage options as one JSON object")
    parser.add_argument("--region", action="append", default=None, metavar="REGION_ID",
                        help="limit to this region (repeatable; default: all regions)")


def add_job_arguments(parser: argparse.ArgumentParser, job: str) -> None:
    """The options of one job (besides the common ones)."""
    if job == "merge":
        parser.add_argument("--max-generations-per-commit", type=int, default=8)
        parser.add_argument("--max-bytes-per-commit", type=int, default=512 * 1024 * 1024)
        parser.add_argument("--up-to-generation", type=int, default=None,
                            help="merge no further than this generation (needs exactly one --region)")
    elif job == "catchup":
        parser.add_argument("--index", action="append", default=None, metavar="NAME",
                            help="only this base-table index (repeatable; default: every maintained index)")
    elif job == "snapshot":
        parser.add_argument("--inline-threshold", type=int, default=100,
                            help="store snapshots inline up to this many regions, else as index.lance")
    elif job == "gc":
        parser.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
        parser.add_argument("--keep-manifest-versions", type=int, default=10)
        parser.add_argument("--grace-period-s", type=float, default=3600.0,
                            help="age after which an unlisted generation directory counts as a failed flush")
    else:
        raise ValueError(f"unknown job {job!r}; expected one of {JOBS}")


def run_job(job: str, args: argparse.Namespace, *, dedup: Callable | None = None,
            read_manifests: Callable | None = None) -> dict[str, Any]:
    """Run one job in this process; returns its JSON-ready summary. Spark passes its own hooks."""
    options = parse_storage_options(args.storage_option, args.storage_options_json)
    regions = args.region
    if job == "merge":
        from memwal.merge import MergeConfig, local_dedup, merge_region, merge_table

        config = MergeConfig(max_generations_per_commit=args.max_generations_per_commit,
                             max_bytes_per_commit=args.max_bytes_per_commit)
        if args.up_to_generation is not None:
            if not regions or len(regions) != 1:
                raise argparse.ArgumentTypeError("--up-to-generation needs exactly one --region")
            from memwal.merge import MergeSummary

            result = merge_region(args.table, options, regions[0], config, dedup or local_dedup,
                                  up_to_generation=args.up_to_generation)
            return MergeSummary(args.table, regions=[result]).to_dict()
        return merge_table(args.table, options, regions, config, dedup or local_dedup).to_dict()
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
    raise ValueError(f"unknown job {job!r}; expected one of {JOBS}")


def job_failed(summary: dict[str, Any]) -> str | None:
    """A one-line reason if the summary reports failed regions or indexes, else None."""
    job = summary.get("job", "job")
    for item in summary.get("regions", []) + summary.get("indexes", []):
        if item.get("error"):
            name = item.get("region_id") or item.get("index_name")
            failed = len(summary.get("failed_regions") or summary.get("failed_indexes") or [name])
            return f"{job}: {failed} failed; first: {name}: {str(item['error']).splitlines()[0]}"
    for key in ("failed_regions", "failed_indexes"):
        if summary.get(key):
            return f"{job}: {key.replace('_', ' ')}: {', '.join(summary[key])}"
    return None
