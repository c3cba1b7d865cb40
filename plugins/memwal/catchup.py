"""Index catch-up: bring base-table indexes up to date with merged data and record index_catchup.

The merged generations are read at table version V0 and every maintained index is optimised
incrementally (Lance's optimize_indices) from V0. Only once the index really covers every fragment of
V0 is index_catchup[index][region] raised to merged_generations[region] as of V0, never more: data
merged after V0 may be uncovered. The commit goes through commit_details (no progress regression).

`indexed_read_plan` is the planner side (memwal-spec.txt, Indexed Read Plan): for an indexed query,
which generations must be served from flushed MemTables' own indexes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import lance

from memwal.mem_wal_index import MemWalIndexDetails
from memwal.region_manifest import RegionManifest
from memwal.table import MemWalTable, TableLike

__all__ = ["CatchupSummary", "IndexCatchupResult", "IndexedReadPlan", "catchup_table", "indexed_read_plan"]

log = logging.getLogger(__name__)


@dataclass
class IndexCatchupResult:
    index_name: str
    optimized: bool = False
    covered: bool = False
    uncovered_fragments: list[int] = field(default_factory=list)
    caught_up_generations: dict[str, int] = field(default_factory=dict)
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


def _covered_fragments(ds: lance.LanceDataset, name: str) -> set[int]:
    for desc in ds.describe_indices():
        if desc.name == name:
            return {int(f) for seg in desc.segments for f in seg.fragment_ids}
    return set()


def _uncovered(ds0: lance.LanceDataset, ds1: lance.LanceDataset, name: str) -> list[int]:
    """Fragments of ds0 still present in ds1 that the index at ds1 does not cover."""
    frags0 = {f.fragment_id for f in ds0.get_fragments() if f.count_rows() > 0}
    frags1 = {f.fragment_id for f in ds1.get_fragments()}
    return sorted((frags0 & frags1) - _covered_fragments(ds1, name))


def catchup_table(table: TableLike, index_names: Sequence[str] | None = None) -> CatchupSummary:
    """Optimise every maintained index (or the given ones) and record what it now covers."""
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
            if _uncovered(ds0, ds0, name):
                ds0.optimize.optimize_indices(index_names=[name])
                result.optimized = True
                summary.commits += 1
            ds1 = table.refresh().dataset
            result.uncovered_fragments = _uncovered(ds0, ds1, name)
            result.covered = not result.uncovered_fragments
            if result.covered:
                result.caught_up_generations = dict(merged)
            else:
                log.warning("index %s does not cover fragments %s of version %d; not recording catch-up",
                            name, result.uncovered_fragments, index0.table_version)
        except (OSError, ValueError) as exc:
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


@dataclass(frozen=True)
class IndexedReadPlan:
    """For one region and one index: generations to serve from flushed MemTables' own indexes.

    gap: merged but not yet covered by the base-table index, (index_gen, merged_gen];
    unmerged: flushed but not merged, always read from the MemTables.
    """

    region_id: str
    index_generation: int
    merged_generation: int
    gap: tuple[int, ...]
    unmerged: tuple[int, ...]


def indexed_read_plan(
    details: MemWalIndexDetails, index_name: str, manifests: Mapping[str, RegionManifest] | Sequence[RegionManifest]
) -> dict[str, IndexedReadPlan]:
    """The indexed read plan per region. An index absent from index_catchup is fully caught up."""
    if not isinstance(manifests, Mapping):
        manifests = {m.region_id: m for m in manifests}
    per_region = details.index_catchup.get(index_name)
    plans = {}
    for region_id, m in manifests.items():
        merged = details.merged_generation(region_id)
        index_gen = merged if per_region is None else min(per_region.get(region_id, 0), merged)
        flushed = sorted(fg.generation for fg in m.flushed_generations)
        plans[region_id] = IndexedReadPlan(
            region_id, index_gen, merged,
            gap=tuple(g for g in flushed if index_gen < g <= merged),
            unmerged=tuple(g for g in flushed if g > merged),
        )
    return plans
