"""The policies of table upkeep, version retention, compaction and index segments, with their defaults in one place.

The `memwal` command and the Spark entry points (argparse) and the Airflow tables file derive theirs from
these, and every value is checked by `memwal.option_values` (the check they all share). Nothing here
imports Lance: DAG files read these defaults while they parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from memwal.errors import BadInputError
from memwal.option_values import check_fields, count, optional, ratio, seconds

__all__ = ["DEFAULT_MAX_INDEX_SEGMENTS", "CompactionConfig", "IndexPolicy", "RetentionConfig"]

# Every segment of an index is searched on its own (a vector query probes its partitions in each segment),
# so query work grows with segments, and compaction cannot combine fragments covered by different
# segments. Folding reuses the trained model (no retraining) but rewrites the folded segments' files: at 4
# a query searches at most 4 segments and a table caught up once per cycle folds once every 3 cycles.
DEFAULT_MAX_INDEX_SEGMENTS = 4


@dataclass(frozen=True)
class RetentionConfig:
    """The retention policy of one table: versions older than `older_than_s` are removed, but the newest
    `keep_versions` always stay (LanceDB's default age is 7 days). `delete_unverified` lets Lance also remove
    unreferenced files younger than 7 days (left by a preempted compaction or a failed write, but also
    those of a write not committed yet): the CLI's explicit opt-in only, run under the MemWAL index lock;
    the tables file refuses it. `enabled: false` makes the job plan, report and remove nothing."""

    enabled: bool = True
    older_than_s: float = 7 * 86400.0
    keep_versions: int = 10
    delete_unverified: bool = False
    dry_run: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "retention", {"older_than_s": seconds, "keep_versions": count})  # the latest stays


@dataclass(frozen=True)
class CompactionConfig:
    """Compaction of one table. target_rows_per_fragment / materialize_deletions_threshold: Lance's options
    (fragments below the target are merged; a fragment with more deleted rows than the threshold is
    rewritten). max_fragments / max_small_fragments / max_deleted_ratio: when it is due. force: compact
    even when not due. use_lock: hold the MemWAL index lock for each round. max_tasks_per_round: tasks
    committed per round (None: all). max_attempts: rounds refused as preempted before giving up."""

    enabled: bool = True
    target_rows_per_fragment: int = 1_048_576
    materialize_deletions_threshold: float = 0.1
    max_fragments: int = 64
    max_small_fragments: int = 16
    max_deleted_ratio: float = 0.1
    force: bool = False
    use_lock: bool = True
    max_tasks_per_round: int | None = None
    max_attempts: int = 5

    def __post_init__(self) -> None:
        check_fields(self, "compaction", {
            "target_rows_per_fragment": count, "materialize_deletions_threshold": ratio, "max_fragments": count,
            "max_small_fragments": count, "max_deleted_ratio": ratio, "max_tasks_per_round": optional(count),
            "max_attempts": count})


@dataclass(frozen=True)
class IndexPolicy:
    """The index segments of one table. Catch-up folds an index's newest segments into one (Lance's
    `num_indices_to_merge`, reusing the trained model) when it has, or would have after adding the new
    rows, more than `max_segments` segments (`memwal.index_segments`). None: unbounded (Lance's default: a
    vector index gains a segment per catch-up). `max_segments_per_index` overrides it for named indexes."""

    max_segments: int | None = DEFAULT_MAX_INDEX_SEGMENTS
    max_segments_per_index: Mapping[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, "index_policy", {"max_segments": optional(count)})
        for name, value in self.max_segments_per_index.items():
            try:
                optional(count)(value)
            except ValueError as exc:
                raise BadInputError(f"index_policy max_segments_per_index.{name}: {exc}") from None

    def limit(self, index_name: str) -> int | None:
        """The segment bound of one index (None: unbounded)."""
        return self.max_segments_per_index.get(index_name, self.max_segments)
