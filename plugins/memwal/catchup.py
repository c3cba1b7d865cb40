"""Index catch-up: bring base-table indexes up to date with merged data and record index_catchup.

The merged generations are read at table version V0 and every maintained index is optimised
incrementally (Lance's optimize_indices) from V0. Only once the index really covers every fragment of
V0 is index_catchup[index][region] raised to merged_generations[region] as of V0, never more: data
merged after V0 may be uncovered. The commit goes through commit_details (no progress regression).
An index over its segment bound (`IndexPolicy`) has its newest segments folded (`memwal.index_segments`).

With a `DistributedBuild` (the `spark` engine), an index with enough rows to index has its segments built as
tasks over fragment groups and committed at V0 under the MemWAL index lock (`memwal.index_build`); the same
coverage rule then records it. Each index's result says where it was built and why.

Which indexes: the maintained ones (`memwal.maintained_indexes.catchup_names`: the primary key's BTREE too,
which the spec maintains implicitly). A maintained index the base table does not have at V0 (dropped) is
skipped on every path with a warning naming the table and the index (`skipped` in its result); it holds
nothing back: Lance core keeps no index_catchup entry for it, so GC does not wait for it.

`rebuild_indexes` recreates maintained indexes from scratch, vector ones retrained (the catch-up operator's
`rebuild`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import lance

from memwal import index_build, naming
from memwal.compaction import is_preempted
from memwal.index_coverage import covered_fragments, live_fragments
from memwal.index_segments import fold_options, is_vector_index, rebuild_vector_index, segment_counts
from memwal.maintained_indexes import catchup_names
from memwal.maintenance_config import CompactionConfig, IndexPolicy
from memwal.mem_wal_index import MemWalIndexDetails
from memwal.table import MemWalTable, TableLike
from memwal.task_runner import TaskRunner

__all__ = ["CatchupSummary", "DistributedBuild", "IndexCatchupResult", "catchup_table", "rebuild_indexes",
           "record_catchup", "set_coverage"]

log = logging.getLogger(__name__)


@dataclass
class IndexCatchupResult:
    index_name: str
    optimized: bool = False
    covered: bool = False
    uncovered_fragments: list[int] = field(default_factory=list)
    caught_up_generations: dict[str, int] = field(default_factory=dict)
    segments_before: int = 0
    segments_after: int = 0
    folded_segments: int = 0  # newest segments merged into one (Lance's num_indices_to_merge); 0: no fold
    duration_s: float = 0.0
    error: str | None = None
    where: str = "in_process"  # where the new rows were indexed: in_process (optimize_indices) or the runner's
    why: str = ""  # why there
    segments_built: int = 0  # segments built by tasks and committed together (the distributed path)
    rows_to_index: int = 0  # live rows of V0 the index did not cover
    skipped: str | None = None  # why the index was not caught up and is nothing to wait for (not on the base)


@dataclass(frozen=True)
class DistributedBuild:
    """Where and how catch-up builds segments in parallel: `runner` runs the tasks (`where` names it in the
    summary), at most `groups` segments per index, `threads` Lance CPU threads per task (the task's cores).
    Taken for an index with at least `min_rows` rows to index; a segment gets at least `min_group_rows`."""

    runner: TaskRunner
    groups: int
    where: str = "spark"
    threads: int | None = None
    min_rows: int | None = None  # None: by the index's kind (`memwal.index_build.min_rows`)
    min_group_rows: int = index_build.MIN_GROUP_ROWS


@dataclass
class CatchupSummary:
    table_uri: str
    read_version: int = 0
    table_version_after: int = 0
    indexes: list[IndexCatchupResult] = field(default_factory=list)
    commits: int = 0
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "job": "catchup",
                "failed_indexes": [i.index_name for i in self.indexes if i.error],
                "uncovered_indexes": [i.index_name for i in self.indexes
                                      if not i.error and not i.skipped and not i.covered],
                "skipped_indexes": [i.index_name for i in self.indexes if i.skipped]}


def _uncovered(frags0: set[int], ds1: lance.LanceDataset, name: str) -> list[int]:
    """Fragments of V0 (`frags0`, its live fragments) still present in ds1 that the index at ds1 does not
    cover."""
    frags1 = {f.fragment_id for f in ds1.get_fragments()}
    return sorted((frags0 & frags1) - (covered_fragments(ds1, name) or set()))


def set_coverage(result: IndexCatchupResult, frags0: set[int], ds1: lance.LanceDataset, merged: dict[str, int],
                 read_version: int) -> None:
    """The rule both paths record by: only when the index at ds1 covers every live fragment of V0 (`frags0`,
    still present) is index_catchup raised, to merged_generations as of V0 (`merged`), never more."""
    result.segments_after = segment_counts(ds1).get(result.index_name, 0)
    result.uncovered_fragments = _uncovered(frags0, ds1, result.index_name)
    result.covered = not result.uncovered_fragments
    if result.covered:
        result.caught_up_generations = dict(merged)
    else:
        log.warning("index %s does not cover fragments %s of version %d; not recording catch-up",
                    result.index_name, result.uncovered_fragments, read_version)


def record_catchup(table: MemWalTable, results: Sequence[IndexCatchupResult]) -> int | None:
    """Raise index_catchup to what `results` recorded (never lower; commit_details takes the MemWAL index
    lock); the committed table version, or None when nothing was recorded."""
    recorded = {r.index_name: r.caught_up_generations for r in results if r.caught_up_generations}
    if not recorded:
        return None

    def mutate(d: MemWalIndexDetails) -> MemWalIndexDetails:
        catchup = {n: dict(regions) for n, regions in d.index_catchup.items()}
        for n, regions in recorded.items():
            mine = catchup.setdefault(n, {})
            for region, gen in regions.items():
                mine[region] = max(mine.get(region, 0), gen)
        return replace(d, index_catchup=catchup)

    return table.commit_details(mutate).table_version


def _route(ds0: lance.LanceDataset, name: str, rows: int, distributed: DistributedBuild | None) -> tuple[str, str]:
    """(where, why) the new rows of index `name` are indexed."""
    if distributed is None:
        return "in_process", "no task runner (engine local)"
    desc = index_build.describe(ds0, name)
    threshold = index_build.min_rows(desc) if distributed.min_rows is None else distributed.min_rows
    if rows < threshold:
        return "in_process", f"{rows} rows to index, under the distributed threshold of {threshold}"
    reason = index_build.fallback(desc)
    if reason:
        return "in_process", reason
    return distributed.where, f"{rows} rows to index, at least {threshold}"


def _build_distributed(table: MemWalTable, ds0: lance.LanceDataset, name: str, uncovered: list[int],
                       distributed: DistributedBuild, result: IndexCatchupResult) -> None:
    """Plan, build the segments through the runner, commit them at V0 under the MemWAL index lock."""
    plan = index_build.plan_build(table, ds0, name, uncovered, distributed.groups, distributed.threads,
                                  distributed.min_group_rows)
    try:
        segments = index_build.build_segments(plan, distributed.runner)
    except Exception as exc:  # a task's failure, as its runner raises it (Lance's error, Spark's job failure)
        raise RuntimeError(f"building segments of index {name} ({distributed.where}) failed: "
                           f"{' '.join(str(exc).split())[:2000]}") from exc
    with table.index_lock():
        table.check_lease()
        index_build.commit_segments(table, plan.read_version, segments)
    result.segments_built = len(segments)
    log.info("index %s: %d segments over %d rows built (%s) and committed at version %d", name, len(segments),
             plan.rows, result.where, plan.read_version)


def _skip_absent(table: MemWalTable, name: str, version: int, result: IndexCatchupResult) -> None:
    """A maintained index the base table does not have (dropped): nothing to build or record, and nothing
    for GC to wait for (`memwal.index_coverage.with_coverage`); the flush skips it too (`memwal.generation_indexes`)."""
    result.skipped = f"not on the base table at version {version}"
    log.warning("%s: maintained index %s is not on the base table at version %d (dropped?): skipped; remove it "
                "from maintained_indexes with `memwal indexes drop %s %s`", table.uri, name, version, table.uri, name)


def catchup_table(table: TableLike, index_names: Sequence[str] | None = None,
                  policy: IndexPolicy | None = None, compaction: CompactionConfig | None = None,
                  distributed: DistributedBuild | None = None) -> CatchupSummary:
    """Optimise every maintained index (or the given ones), folding its segments when the policy says so
    (or when they block a compaction due by `compaction`'s rules), and record what it now covers. With
    `distributed`, the new rows of an index with enough of them are indexed as segments built in parallel."""
    policy = policy or IndexPolicy()
    started = time.monotonic()
    table = MemWalTable.of(table)
    index0 = table.refresh().index
    summary = CatchupSummary(index0.table_uri, read_version=index0.table_version)
    merged = dict(index0.details.merged_generations)
    names = list(index_names) if index_names is not None else catchup_names(table)
    on_base = {d.name for d in table.dataset.checkout_version(index0.table_version).describe_indices()}
    for name in names:
        result = IndexCatchupResult(name)
        if name not in on_base:
            _skip_absent(table, name, index0.table_version, result)
            summary.indexes.append(result)
            continue
        t0 = time.monotonic()
        try:
            ds0 = table.dataset.checkout_version(index0.table_version)
            # V0's fragments, read before optimize_indices: it moves ds0 in place to the version it commits,
            # which holds whatever else committed meanwhile (a merge's new, unindexed fragments).
            frags0 = live_fragments(ds0)
            uncovered = _uncovered(frags0, ds0, name)
            rows = index_build.fragment_rows(ds0)
            result.rows_to_index = sum(rows.get(f, 0) for f in uncovered)
            result.segments_before = segment_counts(ds0).get(name, 0)
            result.where, result.why = _route(ds0, name, result.rows_to_index, distributed) if uncovered else \
                ("in_process", "nothing to index")
            if uncovered and distributed is not None and result.where == distributed.where:
                _build_distributed(table, ds0, name, uncovered, distributed, result)
                summary.commits += 1
                # Then the policy's fold, in process: Lance merges the segments' encoded data with the model
                # they share (no retraining, no rereading of the vectors the tasks encoded).
                ds0 = table.refresh().dataset
                appending = False
            else:
                appending = bool(uncovered)
            fold = fold_options(ds0, name, policy, appending, compaction)
            folded = fold.get("num_indices_to_merge", 0)
            if appending or folded:
                ds0.optimize.optimize_indices(index_names=[name], **fold)
                result.optimized = True
                result.folded_segments = folded
                summary.commits += 1
            set_coverage(result, frags0, table.refresh().dataset, merged, index0.table_version)
        except OSError as exc:
            if not is_preempted(exc):
                result.error = str(exc)
                log.error("index %s: catch-up failed: %s", name, exc)
            else:  # a compaction rewrote fragments meanwhile: nothing recorded, the next run catches up
                log.warning("index %s: catch-up preempted by a concurrent commit; not recording catch-up: %s",
                            name, str(exc).splitlines()[0])
        except (ValueError, RuntimeError) as exc:
            result.error = str(exc)
            log.error("index %s: catch-up failed: %s", name, exc)
        result.duration_s = time.monotonic() - t0
        summary.indexes.append(result)

    version = record_catchup(table, summary.indexes)
    if version is not None:
        summary.commits += 1
        summary.table_version_after = version
    else:
        summary.table_version_after = table.refresh().version
    summary.duration_s = time.monotonic() - started
    return summary


def rebuild_indexes(table: MemWalTable, names: Sequence[str] | None = None) -> list[str]:
    """Recreate the maintained indexes (or `names`) from scratch (Lance replace=True), under the MemWAL
    index lock; catch-up then records them as covering the table. A vector index is retrained with the
    parameters it reports (`memwal.index_segments.rebuild_vector_index`; ValueError when they cannot be read).
    ValueError naming an unknown index of `names`; a maintained index not on the base table is skipped."""
    wanted = list(names) if names else table.maintained_indexes()
    described = {d.name: d for d in table.refresh().dataset.describe_indices() if d.name != naming.MEM_WAL_INDEX_NAME}
    missing = [n for n in wanted if n not in described]
    if missing and names:
        raise ValueError(f"no index named {', '.join(missing)} (indexes: {', '.join(sorted(described)) or 'none'})")
    for name in missing:  # maintained but dropped from the base table: nothing to rebuild
        log.warning("%s: maintained index %s is not on the base table: not rebuilt", table.uri, name)
    wanted = [n for n in wanted if n in described]
    rebuilt = []
    with table.index_lock():
        for name in wanted:
            d = described[name]
            if is_vector_index(d):
                rebuild_vector_index(table.refresh().dataset, name)
                rebuilt.append(name)
                continue
            if len(d.field_names) != 1:
                log.warning("%s: index %s (%s) is not on one column; catch-up optimises it instead of a rebuild",
                            table.uri, name, d.type_url)
                continue
            table.refresh().dataset.create_scalar_index(d.field_names[0], d.index_type, name=name, replace=True)
            rebuilt.append(name)
    return rebuilt
