"""The jobs' options and their defaults, in one place.

`MergeConfig`, `GcConfig` and `JobOptions` are what the library's jobs take. Each option is declared once,
as a field (`memwal.job_spec.option`: its check, flag, help, tables-file key); the `memwal` command and the
Spark entry points (argparse), the argv spark-submit gets, the Airflow tables file and operators derive
from the fields (`memwal.job_spec.JobSpec`). Nothing here imports Lance or Arrow: DAG files read these
defaults while they parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memwal.job_spec import Flag, JobSpec, check_options, option, section
from memwal.maintenance_config import CompactionConfig, IndexPolicy, RetentionConfig
from memwal.option_values import (
    boolean,
    byte_size,
    byte_size_arg,
    count,
    count_arg,
    non_negative,
    non_negative_arg,
    optional,
    seconds,
    seconds_arg,
)

__all__ = ["APPLY_MODES", "DEFAULT_INLINE_THRESHOLD", "GcConfig", "JobOptions", "MergeConfig", "apply_mode",
           "is_true"]

APPLY_MODES = ("auto", "passes", "fragments")  # MergeConfig.apply
DEFAULT_INLINE_THRESHOLD = 100  # regions up to which snapshots are stored inline in the MemWAL index


@dataclass(frozen=True)
class MergeConfig:
    """Budgets of one commit and of one planning round.

    max_generations_per_commit: generations of one region one commit may apply (always at least one);
    max_bytes_per_commit: generation bytes one commit may apply, over all the regions it carries.
    max_commits_per_round: how many commits are planned (and, with a batch dedup, staged) before the index
    is read again. max_attempts: refused commits of a region before it is reported failed.
    planning_threads: region manifests read, and (in process) a commit's region batches deduplicated, in
    parallel.
    apply: how a commit reaches the base table: "passes" (a delete pass and an upsert pass, Lance
    merge-insert), "fragments" (`memwal.merge_apply`: rows located, fragments rewritten in tasks, one
    Update then the marker) or "auto" (`memwal.merge_apply.choose_apply`).
    """

    max_generations_per_commit: int = option(8, check=count, table=True, operator="int", flag=Flag(
        "--max-generations-per-commit", parse=count_arg))
    max_bytes_per_commit: int = option(512 * 1024 * 1024, check=count, table=byte_size, operator="int", flag=Flag(
        "--max-bytes-per-commit", "e.g. 536870912, 512MiB, 1g", byte_size_arg))
    max_attempts: int = option(20, check=count)
    max_commits_per_round: int = option(32, check=count)
    planning_threads: int = option(8, check=count)
    apply: str = option("auto", check=lambda v: apply_mode(v), table=True, flag=Flag(
        "--apply", "how commits reach the base table: two merge-insert passes, fragments rewritten in tasks "
        "(memwal.merge_apply), or auto (fragments when tasks run on Spark)", choices=APPLY_MODES, rank=1))

    def __post_init__(self) -> None:
        check_options(self, "merge")


def apply_mode(value: Any) -> str:
    """An `apply` value checked (MergeConfig.apply, the tables file's `apply`)."""
    if value not in APPLY_MODES:
        raise ValueError(f"must be one of {', '.join(APPLY_MODES)}, not {value!r}")
    return value


@dataclass(frozen=True)
class GcConfig:
    """keep_manifest_versions: region-manifest versions kept; grace_period_s: age after which an unlisted
    generation directory (a failed flush) or abandoned staging is removed; dry_run: delete nothing;
    enabled (the tables file's `gc.enabled`): false makes the maintenance DAG's GC a dry run."""

    enabled: bool = option(True, table=boolean)
    dry_run: bool = option(False, operator="flag", flag=Flag(
        "--dry-run", "list what would be deleted, delete nothing", kind="on"))
    keep_manifest_versions: int = option(10, check=count, table=True, flag=Flag(
        "--keep-manifest-versions", parse=count_arg))
    grace_period_s: float = option(3600.0, check=seconds, table=True, flag=Flag(
        "--grace-period-s", "age after which an unlisted generation directory counts as a failed flush",
        seconds_arg))

    def __post_init__(self) -> None:
        check_options(self, "gc")


@dataclass(frozen=True)
class JobOptions:
    """The typed options of the jobs (each job reads its own): what `memwal.jobs.run_job` takes.

    merge, up_to_generation: the merge's budgets and its bound (up_to_generation needs exactly one region);
    indexes: the base-table indexes catch-up brings up to date (None: every maintained index);
    index_policy: catch-up's bound on index segments (`memwal.maintenance_config.IndexPolicy`);
    inline_threshold: snapshots are stored inline up to this many regions; gc: GC's settings;
    compaction, retention: their policies (`memwal.maintenance_config`).
    """

    merge: MergeConfig = section("merge", MergeConfig, flat=True)
    up_to_generation: int | None = option(None, check=optional(count), operator="int", job="merge", flag=Flag(
        "--up-to-generation", "merge no generation above this one (needs exactly one --region)", count_arg))
    indexes: tuple[str, ...] | None = option(None, operator="list", job="catchup", flag=Flag(
        "--index", "only this base-table index (repeatable; default: every maintained index)", kind="append",
        metavar="NAME", collect=lambda names: tuple(names) or None, words=lambda names: list(names or ()), rank=-1))
    index_policy: IndexPolicy = section("catchup", IndexPolicy)
    inline_threshold: int = option(DEFAULT_INLINE_THRESHOLD, check=non_negative, table=True, job="snapshot",
                                   table_key="snapshot_inline_threshold", flag=Flag(
        "--inline-threshold", "store snapshots inline up to this many regions, else as index.lance",
        non_negative_arg))
    gc: GcConfig = section("gc", GcConfig)
    compaction: CompactionConfig = section("compaction", CompactionConfig)
    retention: RetentionConfig = section("retention", RetentionConfig)

    def __post_init__(self) -> None:
        check_options(self, "job")

    def argv(self, job: str) -> list[str]:
        """The options of `job` that differ from their defaults, as the job's command line takes them
        (for a job started as another process: spark-submit)."""
        return JobSpec(job, JobOptions).argv(self)


def is_true(value: Any) -> bool:
    """true / 1 / yes (any case, or a bool) as True; anything else False. The one parser of such flags."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")
