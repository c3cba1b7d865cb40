"""The jobs' options and their defaults, in one place.

`MergeConfig`, `GcConfig` and `JobOptions` are what the library's jobs take; the `memwal` command and the
Spark entry points (argparse) and the Airflow tables file derive their defaults from them, and check values with
`memwal.option_values`, as these dataclasses do. Nothing here
imports Lance or Arrow: DAG files read these defaults while they parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memwal.maintenance_config import CompactionConfig, IndexPolicy, RetentionConfig
from memwal.option_values import check_fields, count, optional, seconds

__all__ = ["APPLY_MODES", "DEFAULT_INLINE_THRESHOLD", "GcConfig", "JobOptions", "MergeConfig", "apply_mode",
           "is_true"]

APPLY_MODES = ("auto", "passes", "fragments")  # MergeConfig.apply
DEFAULT_INLINE_THRESHOLD = 100  # regions up to which snapshots are stored inline in the MemWAL index


@dataclass(frozen=True)
class MergeConfig:
    """Budgets of one commit (over all the regions it carries) and of one planning round.

    max_generations_per_commit / max_bytes_per_commit: generations and generation bytes one commit may
    apply (always at least one generation). max_commits_per_round: how many commits are planned (and, with
    a batch dedup, staged) before the index is read again. max_attempts: refused commits of a region
    before it is reported failed. planning_threads: region manifests read in parallel while planning.
    apply: how a commit reaches the base table: "passes" (a delete pass and an upsert pass, Lance
    merge-insert), "fragments" (`memwal.merge_apply`: rows located, fragments rewritten in tasks, one
    Update then the marker) or "auto" (`memwal.merge_apply.choose_apply`).
    """

    max_generations_per_commit: int = 8
    max_bytes_per_commit: int = 512 * 1024 * 1024
    max_attempts: int = 20
    max_commits_per_round: int = 32
    planning_threads: int = 8
    apply: str = "auto"

    def __post_init__(self) -> None:
        check_fields(self, "merge", {"max_generations_per_commit": count, "max_bytes_per_commit": count,
                                     "max_attempts": count, "max_commits_per_round": count,
                                     "planning_threads": count, "apply": apply_mode})


def apply_mode(value: Any) -> str:
    """An `apply` value checked (MergeConfig.apply, the tables file's `apply`)."""
    if value not in APPLY_MODES:
        raise ValueError(f"must be one of {', '.join(APPLY_MODES)}, not {value!r}")
    return value


@dataclass(frozen=True)
class GcConfig:
    """keep_manifest_versions: region-manifest versions kept; grace_period_s: age after which an unlisted
    generation directory (a failed flush) or abandoned staging is removed; dry_run: delete nothing."""

    keep_manifest_versions: int = 10
    grace_period_s: float = 3600.0
    dry_run: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "gc", {"keep_manifest_versions": count, "grace_period_s": seconds})


@dataclass(frozen=True)
class JobOptions:
    """The typed options of the jobs (each job reads its own): what `memwal.jobs.run_job` takes.

    merge, up_to_generation: the merge's budgets and its bound (up_to_generation needs exactly one region);
    indexes: the base-table indexes catch-up brings up to date (None: every maintained index);
    index_policy: catch-up's bound on index segments (`memwal.maintenance_config.IndexPolicy`);
    inline_threshold: snapshots are stored inline up to this many regions; gc: GC's settings;
    compaction, retention: their policies (`memwal.maintenance_config`).
    """

    merge: MergeConfig = field(default_factory=MergeConfig)
    up_to_generation: int | None = None
    indexes: tuple[str, ...] | None = None
    index_policy: IndexPolicy = field(default_factory=IndexPolicy)
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    gc: GcConfig = field(default_factory=GcConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)

    def __post_init__(self) -> None:
        check_fields(self, "job", {"up_to_generation": optional(count),
                                   "inline_threshold": lambda v: count(v, 0)})

    def argv(self, job: str) -> list[str]:
        """The options of `job` that differ from their defaults, as the job's command line takes them
        (for a job started as another process: spark-submit)."""
        default = JobOptions()
        out: list[str] = []

        def flag(name: str, value: Any, default_value: Any) -> None:
            if value is not None and value != default_value:
                out.extend([name, str(value)])

        if job == "merge":
            flag("--max-generations-per-commit", self.merge.max_generations_per_commit,
                 default.merge.max_generations_per_commit)
            flag("--max-bytes-per-commit", self.merge.max_bytes_per_commit, default.merge.max_bytes_per_commit)
            flag("--apply", self.merge.apply, default.merge.apply)
            flag("--up-to-generation", self.up_to_generation, None)
        elif job == "catchup":
            for name in self.indexes or ():
                out.extend(["--index", name])
            if self.index_policy.max_segments is None:
                out.append("--unbounded-segments")
            flag("--max-segments", self.index_policy.max_segments, default.index_policy.max_segments)
            for name, limit in sorted(self.index_policy.max_segments_per_index.items()):
                out.extend(["--max-segments-of", f"{name}={'none' if limit is None else limit}"])
        elif job == "snapshot":
            flag("--inline-threshold", self.inline_threshold, default.inline_threshold)
        elif job == "gc":
            if self.gc.dry_run:
                out.append("--dry-run")
            flag("--keep-manifest-versions", self.gc.keep_manifest_versions, default.gc.keep_manifest_versions)
            flag("--grace-period-s", self.gc.grace_period_s, default.gc.grace_period_s)
        elif job == "compaction":
            c, d = self.compaction, default.compaction
            for name in ("target_rows_per_fragment", "materialize_deletions_threshold", "max_fragments",
                         "max_small_fragments", "max_deleted_ratio", "max_tasks_per_round"):
                flag("--" + name.replace("_", "-"), getattr(c, name), getattr(d, name))
            if c.force:
                out.append("--force")
            if not c.use_lock:
                out.append("--no-lock")
        elif job == "retention":
            r, d = self.retention, default.retention
            flag("--older-than-s", r.older_than_s, d.older_than_s)
            flag("--keep-versions", r.keep_versions, d.keep_versions)
            if r.delete_unverified:
                out.append("--delete-unverified")
            if r.dry_run:
                out.append("--dry-run")
        return out


def is_true(value: Any) -> bool:
    """true / 1 / yes (any case, or a bool) as True; anything else False. The one parser of such flags."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")
