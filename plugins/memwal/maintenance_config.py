"""The policies of table upkeep, version retention, compaction and index segments, with their defaults in one place.

The `memwal` command and the Spark entry points (argparse) and the Airflow tables file derive theirs from
these. Nothing here imports Lance: DAG files read these defaults while they parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
    unreferenced files younger than 7 days (left by a preempted compaction or a failed write): only when
    no other process writes the table. `enabled: false` makes the job report and remove nothing."""

    enabled: bool = True
    older_than_s: float = 7 * 86400.0
    keep_versions: int = 10
    delete_unverified: bool = False
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.keep_versions < 1:
            raise ValueError(f"retention keep_versions {self.keep_versions} is not >= 1 (the latest always stays)")
        if self.older_than_s < 0:
            raise ValueError(f"retention older_than_s {self.older_than_s} is negative")


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
        for name in ("target_rows_per_fragment", "max_fragments", "max_small_fragments", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"compaction {name} {getattr(self, name)} is not >= 1")
        if self.max_tasks_per_round is not None and self.max_tasks_per_round < 1:
            raise ValueError(f"compaction max_tasks_per_round {self.max_tasks_per_round} is not >= 1")
        for name in ("materialize_deletions_threshold", "max_deleted_ratio"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"compaction {name} {getattr(self, name)} is not between 0 and 1")


@dataclass(frozen=True)
class IndexPolicy:
    """The index segments of one table. Catch-up folds an index's newest segments into one (Lance's
    `num_indices_to_merge`, reusing the trained model) when it has, or would have after adding the new
    rows, more than `max_segments` segments (`memwal.index_segments`). None: unbounded (Lance's default: a
    vector index gains a segment per catch-up). `max_segments_per_index` overrides it for named indexes."""

    max_segments: int | None = DEFAULT_MAX_INDEX_SEGMENTS
    max_segments_per_index: Mapping[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in [("max_segments", self.max_segments),
                            *((f"max_segments_per_index.{k}", v) for k, v in self.max_segments_per_index.items())]:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"index policy {name} {value!r} is not an integer >= 1 (or null: unbounded)")

    def limit(self, index_name: str) -> int | None:
        """The segment bound of one index (None: unbounded)."""
        return self.max_segments_per_index.get(index_name, self.max_segments)
