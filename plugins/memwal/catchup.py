"""Index catch-up: bring base-table indexes up to date with merged data and record index_catchup.

The merged generations are read at table version V0 and every maintained index is optimised
incrementally (Lance's optimize_indices) from V0. Only once the index really covers every fragment of
V0 is index_catchup[index][region] raised to merged_generations[region] as of V0, never more: data
merged after V0 may be uncovered. The commit goes through commit_details (no progress regression).
An index over its segment bound (`IndexPolicy`) has its newest segments folded (`memwal.index_segments`).

`rebuild_indexes` recreates maintained indexes from scratch, vector ones retrained (the catch-up operator's
`rebuild`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import lance

from memwal import naming
from memwal.compaction import is_preempted
from memwal.index_coverage import covered_fragments, live_fragments
from memwal.index_segments import fold_options, is_vector_index, rebuild_vector_index, segment_counts
from memwal.maintenance_config import CompactionConfig, IndexPolicy
from memwal.mem_wal_index import MemWalIndexDetails
from memwal.table import MemWalTable, TableLike

__all__ = ["CatchupSummary", "IndexCatchupResult", "catchup_table", "rebuild_indexes"]

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
                "uncovered_indexes": [i.index_name for i in self.indexes if not i.error and not i.covered]}


def _uncovered(frags0: set[int], ds1: lance.LanceDataset, name: str) -> list[int]:
    """Fragments of V0 (`frags0`, its live fragments) still present in ds1 that the index at ds1 does not
    cover."""
    frags1 = {f.fragment_id for f in ds1.get_fragments()}
    return sorted((frags0 & frags1) - (covered_fragments(ds1, name) or set()))


def catchup_table(table: TableLike, index_names: Sequence[str] | None = None,
                  policy: IndexPolicy | None = None, compaction: CompactionConfig | None = None) -> CatchupSummary:
    """Optimise every maintained index (or the given ones), folding its segments when the policy says so
    (or when they block a compaction due by `compaction`'s rules), and record what it now covers."""
    policy = policy or IndexPolicy()
    started = time.monotonic()
    table = MemWalTable.of(table)
    index0 = table.refresh().index
    summary = CatchupSummary(index0.table_uri, read_version=index0.table_version)
    merged = dict(index0.details.merged_generations)
    names = list(index_names) if index_names is not None else table.maintained_indexes()
    for name in names:
        result = IndexCatchupResult(name)
        t0 = time.monotonic()
        try:
            ds0 = table.dataset.checkout_version(index0.table_version)
            # V0's fragments, read before optimize_indices: it moves ds0 in place to the version it commits,
            # which holds whatever else committed meanwhile (a merge's new, unindexed fragments).
            frags0 = live_fragments(ds0)
            appending = bool(_uncovered(frags0, ds0, name))
            fold = fold_options(ds0, name, policy, appending, compaction)
            result.segments_before = segment_counts(ds0).get(name, 0)
            if appending or fold:
                ds0.optimize.optimize_indices(index_names=[name], **fold)
                result.optimized = True
                result.folded_segments = fold.get("num_indices_to_merge", 0)
                summary.commits += 1
            ds1 = table.refresh().dataset
            result.segments_after = segment_counts(ds1).get(name, 0)
            result.uncovered_fragments = _uncovered(frags0, ds1, name)
            result.covered = not result.uncovered_fragments
            if result.covered:
                result.caught_up_generations = dict(merged)
            else:
                log.warning("index %s does not cover fragments %s of version %d; not recording catch-up",
                            name, result.uncovered_fragments, index0.table_version)
        except OSError as exc:
            if not is_preempted(exc):
                result.error = str(exc)
                log.error("index %s: catch-up failed: %s", name, exc)
            else:  # a compaction rewrote fragments meanwhile: nothing recorded, the next run catches up
                log.warning("index %s: catch-up preempted by a concurrent commit; not recording catch-up: %s",
                            name, str(exc).splitlines()[0])
        except ValueError as exc:
            result.error = str(exc)
            log.error("index %s: catch-up failed: %s", name, exc)
        result.duration_s = time.monotonic() - t0
        summary.indexes.append(result)

    recorded = {r.index_name: r.caught_up_generations for r in summary.indexes if r.caught_up_generations}

    def mutate(d: MemWalIndexDetails) -> MemWalIndexDetails:
        catchup = {n: dict(regions) for n, regions in d.index_catchup.items()}
        for n, regions in recorded.items():
            mine = catchup.setdefault(n, {})
            for region, gen in regions.items():
                mine[region] = max(mine.get(region, 0), gen)
        return replace(d, index_catchup=catchup)

    if recorded:
        committed = table.commit_details(mutate)
        summary.commits += 1
        summary.table_version_after = committed.table_version
    else:
        summary.table_version_after = table.refresh().version
    summary.duration_s = time.monotonic() - started
    return summary


def rebuild_indexes(table: MemWalTable, names: Sequence[str] | None = None) -> list[str]:
    """Recreate the maintained indexes (or `names`) from scratch (Lance replace=True), under the MemWAL
    index lock; catch-up then records them as covering the table. A vector index is retrained with the
    parameters it reports (`memwal.index_segments.rebuild_vector_index`; ValueError when they cannot be read).
    ValueError naming an unknown index."""
    wanted = list(names) if names else table.maintained_indexes()
    described = {d.name: d for d in table.refresh().dataset.describe_indices() if d.name != naming.MEM_WAL_INDEX_NAME}
    missing = [n for n in wanted if n not in described]
    if missing:
        raise ValueError(f"no index named {', '.join(missing)} (indexes: {', '.join(sorted(described)) or 'none'})")
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
