"""The six jobs as `memwal.job_spec.JobSpec` objects (`SPECS`): each its options (declared on `JobOptions`
and its options dataclass), its plan (memwal.job_plans) and its run, the library function that does the work
in this process.

A run takes (table handle, JobOptions, regions, **hooks) and returns the JSON-ready summary; the hooks are
what Spark passes (`memwal.jobs.run_job`). The jobs' modules are imported when a job runs, not before:
the `memwal` command and DAG files import this to parse options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from memwal.job_config import JobOptions
from memwal.job_plans import plan_catchup, plan_compaction, plan_driver_only, plan_merge, plan_snapshot
from memwal.job_spec import JobSpec

if TYPE_CHECKING:
    from memwal.table import MemWalTable

__all__ = ["SPECS", "spec"]


def _merge(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *, dedup: Callable | None = None,
           runner: Callable | None = None, parallelism: int = 1, **_: Any) -> dict[str, Any]:
    from memwal.merge import local_dedup, merge_table

    return merge_table(table, regions, options.merge, dedup or local_dedup, up_to_generation=options.up_to_generation,
                       runner=runner, parallelism=parallelism).to_dict()


def _catchup(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *, distributed: Any = None,
             **_: Any) -> dict[str, Any]:
    from memwal.catchup import catchup_table

    return catchup_table(table, index_names=options.indexes, policy=options.index_policy,
                         compaction=options.compaction, distributed=distributed).to_dict()


def _snapshot(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *,
              read_manifests: Callable | None = None, **_: Any) -> dict[str, Any]:
    from memwal.snapshot import read_manifests_threaded, refresh_snapshot

    return refresh_snapshot(table, inline_threshold=options.inline_threshold,
                            read_manifests=read_manifests or read_manifests_threaded).to_dict()


def _gc(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None, **_: Any) -> dict[str, Any]:
    from memwal.gc import gc_table

    return gc_table(table, regions, options.gc).to_dict()


def _compaction(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None, *,
                execute: Callable | None = None, **_: Any) -> dict[str, Any]:
    from memwal.compaction import compact_table, execute_in_process

    return compact_table(table, options.compaction, execute or execute_in_process).to_dict()


def _retention(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None, **_: Any) -> dict[str, Any]:
    from memwal.retention import retain_versions

    return retain_versions(table, options.retention).to_dict()


SPECS: dict[str, JobSpec] = {s.name: s for s in (
    JobSpec("merge", JobOptions, _merge, plan_merge),
    JobSpec("catchup", JobOptions, _catchup, plan_catchup),
    JobSpec("snapshot", JobOptions, _snapshot, plan_snapshot),
    JobSpec("gc", JobOptions, _gc, plan_driver_only("gc")),
    JobSpec("compaction", JobOptions, _compaction, plan_compaction),
    JobSpec("retention", JobOptions, _retention, plan_driver_only("retention")),
)}


def spec(job: str) -> JobSpec:
    """The spec of one job; ValueError naming the jobs for an unknown one."""
    if job not in SPECS:
        raise ValueError(f"unknown job {job!r}; expected one of {tuple(SPECS)}")
    return SPECS[job]
