"""The policies of table upkeep, version retention, compaction and index segments, with their defaults in one place.

Each option is one field (`memwal.job_spec.option`); the `memwal` command and the Spark entry points
(argparse), the argv spark-submit gets and the Airflow tables file derive theirs from the fields, and every
value is checked by `memwal.option_values` (the check they all share). Nothing here
imports Lance: DAG files read these defaults while they parse.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from memwal.errors import BadInputError
from memwal.job_spec import Flag, check_options, option
from memwal.option_values import boolean, count, count_arg, optional, ratio, ratio_arg, seconds, seconds_arg

__all__ = ["DEFAULT_MAX_INDEX_SEGMENTS", "CompactionConfig", "IndexPolicy", "RetentionConfig"]

# Every segment of an index is searched on its own (a vector query probes its partitions in each segment),
# so query work grows with segments, and compaction cannot combine fragments covered by different
# segments. Folding reuses the trained model (no retraining) but rewrites the folded segments' files: at 4
# a query searches at most 4 segments and a table caught up once per cycle folds once every 3 cycles.
DEFAULT_MAX_INDEX_SEGMENTS = 4


def _index_limit(text: str) -> tuple[str, int | None]:
    """A `--max-segments-of INDEX=N` argument (N >= 1, or none: unbounded)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not INDEX=N")
    return name.strip(), None if value.strip().lower() == "none" else count_arg(value)


def _segment_limits(value: object) -> dict[str, int | None]:
    """The tables file's `index_policy.max_segments_per_index`: index name -> a segment count (or null)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a mapping of index name to a segment count")
    out = {}
    for name, limit in value.items():
        try:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"{name!r} is not a non-empty string")
            out[name.strip()] = None if limit is None else count(limit)
        except ValueError as exc:
            raise ValueError(f"index {name!r}: {exc}") from None
    return out


@dataclass(frozen=True)
class RetentionConfig:
    """The retention policy of one table: versions older than `older_than_s` are removed, but the newest
    `keep_versions` always stay (LanceDB's default age is 7 days). `delete_unverified` lets Lance also remove
    unreferenced files younger than 7 days (left by a preempted compaction or a failed write, but also
    those of a write not committed yet): the CLI's explicit opt-in only, run under the MemWAL index lock;
    the tables file refuses it. `enabled: false` makes the job plan, report and remove nothing."""

    enabled: bool = option(True, table=boolean)
    older_than_s: float = option(7 * 86400.0, check=seconds, table=True, flag=Flag(
        "--older-than-s", "remove table versions older than this many seconds (default 7 days)", seconds_arg))
    keep_versions: int = option(10, check=count, table=True, flag=Flag(  # the latest always stays
        "--keep-versions", "always keep the newest N table versions", count_arg))
    delete_unverified: bool = option(False, flag=Flag(
        "--delete-unverified", "DANGEROUS: also delete files no version references however young, which "
        "includes files a writer has not committed yet. Runs under the MemWAL index lock (waits for our merges "
        "and locked compactions), but catch-up, compaction --no-lock and writers outside MemWAL do not take "
        "it: stop them first. --dry-run lists the files it would delete", kind="on"))
    dry_run: bool = option(False, operator="flag", flag=Flag(
        "--dry-run", "list versions and bytes, remove nothing", kind="on"))

    def __post_init__(self) -> None:
        check_options(self, "retention")


@dataclass(frozen=True)
class CompactionConfig:
    """Compaction of one table. target_rows_per_fragment / materialize_deletions_threshold: Lance's options
    (fragments below the target are merged; a fragment with more deleted rows than the threshold is
    rewritten). max_fragments / max_small_fragments / max_deleted_ratio: when it is due. force: compact
    even when not due. use_lock: hold the MemWAL index lock for each round. max_tasks_per_round: tasks
    committed per round (None: all). max_attempts: rounds refused as preempted before giving up."""

    enabled: bool = option(True, table=boolean)
    target_rows_per_fragment: int = option(1_048_576, check=count, table=True, flag=Flag(
        "--target-rows-per-fragment", parse=count_arg))
    materialize_deletions_threshold: float = option(0.1, check=ratio, table=True, flag=Flag(
        "--materialize-deletions-threshold", "rewrite a fragment whose deleted-row share exceeds this", ratio_arg))
    max_fragments: int = option(64, check=count, table=True, flag=Flag(
        "--max-fragments", "due when the table has more fragments", count_arg))
    max_small_fragments: int = option(16, check=count, table=True, flag=Flag(
        "--max-small-fragments", "due when this many fragments hold under half the target rows", count_arg))
    max_deleted_ratio: float = option(0.1, check=ratio, table=True, flag=Flag(
        "--max-deleted-ratio", "due when the share of deleted rows reaches this", ratio_arg))
    max_tasks_per_round: int | None = option(None, check=optional(count), table=True, flag=Flag(
        "--max-tasks-per-round", "commit at most this many tasks per round (bounds how long merges wait)",
        count_arg))
    force: bool = option(False, operator="flag", flag=Flag("--force", "compact even when not due", kind="on"))
    use_lock: bool = option(True, table=boolean, flag=Flag(
        "--no-lock", "do not hold the MemWAL index lock (merges may then preempt a round)", kind="off"))
    max_attempts: int = option(5, check=count, table=True, flag=Flag(
        "--max-attempts", "give up after this many rounds refused because a merge committed first", count_arg))

    def __post_init__(self) -> None:
        check_options(self, "compaction")


@dataclass(frozen=True)
class IndexPolicy:
    """The index segments of one table. Catch-up folds an index's newest segments into one (Lance's
    `num_indices_to_merge`, reusing the trained model) when it has, or would have after adding the new
    rows, more than `max_segments` segments (`memwal.index_segments`). None: unbounded (Lance's default: a
    vector index gains a segment per catch-up). `max_segments_per_index` overrides it for named indexes."""

    max_segments: int | None = option(DEFAULT_MAX_INDEX_SEGMENTS, check=optional(count), table=True, flag=Flag(
        "--max-segments", "fold an index into one segment when it would have more (default %(default)s)",
        count_arg, none_switch=("--unbounded-segments",
                                "never fold (Lance's default: a vector index gains a segment per catch-up)")))
    max_segments_per_index: Mapping[str, int | None] = option(default_factory=dict, table=_segment_limits,
                                                              flag=Flag(
        "--max-segments-of", "the bound of one index (repeatable; N or none: unbounded)", _index_limit,
        kind="append", metavar="INDEX=N", collect=dict,
        words=lambda limits: [f"{k}={'none' if n is None else n}" for k, n in sorted(limits.items())]))

    def __post_init__(self) -> None:
        check_options(self, "index_policy")
        for name, value in self.max_segments_per_index.items():
            try:
                optional(count)(value)
            except ValueError as exc:
                raise BadInputError(f"index_policy max_segments_per_index.{name}: {exc}") from None

    def limit(self, index_name: str) -> int | None:
        """The segment bound of one index (None: unbounded)."""
        return self.max_segments_per_index.get(index_name, self.max_segments)

