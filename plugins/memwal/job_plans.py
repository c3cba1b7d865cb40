"""Each job's plan: what it would do now, from manifests and index metadata only (no data read), and whether
any of it is executor work. A job's `JobSpec.plan` (memwal.job_specs); `memwal.engines` chooses the engine
from it before any Spark starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memwal.job_config import JobOptions
    from memwal.table import MemWalTable

__all__ = ["DRIVER_ONLY", "SPARK_SNAPSHOT_REGIONS", "WorkPlan", "plan_catchup", "plan_compaction", "plan_driver_only",
           "plan_merge", "plan_snapshot"]

DRIVER_ONLY = ("gc", "retention")
# With an explicit Spark engine, a snapshot reads its manifests on the executors from this many regions up.
SPARK_SNAPSHOT_REGIONS = 32


@dataclass
class WorkPlan:
    """What the job would do now, from metadata only: whether any of it is executor work, and the sizes."""

    job: str
    executor_work: bool
    reason: str
    facts: dict[str, Any] = field(default_factory=dict)
    plan_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "plan_s": round(self.plan_s, 3)}


def plan_driver_only(job: str) -> Any:
    """The plan of a job whose work is all on the driver (GC, retention)."""
    def plan(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> WorkPlan:
        return WorkPlan(job, False, f"{job} runs on the driver only")
    return plan


def plan_snapshot(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> WorkPlan:
    n = len(table.regions())
    return WorkPlan("snapshot", n >= SPARK_SNAPSHOT_REGIONS,
                    f"{n} region manifests to read" + ("" if n >= SPARK_SNAPSHOT_REGIONS else
                                                      f" (< {SPARK_SNAPSHOT_REGIONS}: read in process)"),
                    {"regions": n})


def plan_merge(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> WorkPlan:
    from memwal.errors import MemWalError
    from memwal.merge import pending_generations

    index = table.index
    batches = generations = backlog = 0
    for rid in list(regions) if regions else sorted(table.regions()):
        try:
            refs = pending_generations(table, rid, index.details.merged_generation(rid))
        except (MemWalError, OSError):
            batches += 1  # its merge reports the error; count it as work, not as nothing to do
            continue
        if options.up_to_generation is not None:
            refs = [r for r in refs if r.generation <= options.up_to_generation]
        if refs:
            batches += 1
            generations += len(refs)
            backlog += sum(r.nbytes for r in refs)
    facts = {"region_batches": batches, "generations": generations, "backlog_bytes": backlog}
    if not batches:
        return WorkPlan("merge", False, "no generation to merge", facts)
    return WorkPlan("merge", True, f"{generations} generation(s), {backlog} bytes in {batches} region(s) to "
                    "deduplicate", facts)


def plan_compaction(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> WorkPlan:
    from memwal.fragment_health import due_reasons, fragment_health

    config = options.compaction
    health = fragment_health(table.dataset, config.target_rows_per_fragment)
    facts = {"fragments": health.fragments, "small_fragments": health.small_fragments,
             "deleted_rows": health.deleted_rows}
    if not config.enabled:
        return WorkPlan("compaction", False, "compaction is disabled for the table", facts)
    reasons = due_reasons(health, config)
    if config.force and health.fragments > 1:
        reasons = reasons or ["--force"]
    if not reasons:
        return WorkPlan("compaction", False, "compaction is not due", facts)
    return WorkPlan("compaction", True, "compaction is due: " + "; ".join(reasons), facts)


def plan_catchup(table: MemWalTable, options: JobOptions, regions: Sequence[str] | None) -> WorkPlan:
    """Executor work only where an index has enough rows to index for its segments to be built on the
    executors (`memwal.index_build.min_rows` by kind); smaller additions and segment folds run on the driver."""
    from memwal.index_build import min_rows
    from memwal.index_coverage import covered_fragments

    ds = table.dataset
    names = list(options.indexes) if options.indexes else table.maintained_indexes()
    described = {d.name: d for d in ds.describe_indices()}
    rows = {f.fragment_id: f.metadata.physical_rows for f in ds.get_fragments()}
    to_index, large = 0, []
    for name in names:
        if name not in described:  # a maintained index dropped from the base: catch-up skips it
            continue
        covered = covered_fragments(ds, name) or set()
        n = sum(count for fid, count in rows.items() if fid not in covered)
        to_index += n
        if n and name in described and n >= min_rows(described[name]):
            large.append(name)
    facts = {"indexes": len(names), "rows_to_index": to_index, "indexes_to_build_on_executors": large}
    if not to_index:
        return WorkPlan("catchup", False, "no rows to index (segment folds run on the driver)", facts)
    if not large:
        return WorkPlan("catchup", False, f"{to_index} row(s) to index, under every index's threshold for "
                        "segments built on executors (memwal.index_build.DISTRIBUTED_MIN_ROWS)", facts)
    return WorkPlan("catchup", True, f"{to_index} row(s) to index; segments of {', '.join(large)} built on the "
                    "executors", facts)
