"""The indexed read plan shared by the LSM searches (vector, full-text): which sources a search asks, through
which index, and the newest-version check every candidate passes (memwal-spec.txt, Indexed Read Plan).

For each index: the base table searched over its index-covered fragments only (fast_search), plus, per
region, every generation above that index's index_catchup (the gap (index_catchup, merged] is served by the
generations' own indexes: GC keeps them), plus the unmerged generations and the MemTables passed; regions the
filter excludes (`col = v` terms) are pruned. Base rows no index covers and no gap generation explains (a
table written outside MemWAL, a collected gap generation) make the base searched with its unindexed rows
flat (Lance does it), counted. A candidate is returned only if it is its key's newest live version in the
plan's view (memwal.newest_version: bloom filters, then keys), cached on the reader per snapshot with the
opened gap generations and index descriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from memwal.generation import open_generation
from memwal.index_coverage import covered_fragments
from memwal.index_statistics import index_statistics
from memwal.lsm_source import Source
from memwal.newest_version import NewerCheck, base_keys, member, newer_versions, shadowed_in_bulk, upper_view
from memwal.source_cache import cached

if TYPE_CHECKING:
    from memwal.reader import Filter, LsmReader

View = tuple[int, ...]  # positions of the gap generations a plan adds to the reader's sources

__all__ = ["PlannedSource", "SearchCost", "View", "gap_positions", "index_partitions", "is_inverted_index", "is_live",
           "is_vector_index", "live_addresses", "plan_sources", "search_cost", "source_at", "source_index",
           "source_rows", "unindexed_rows", "upper_positions"]

IndexMatch = Callable[[Any, str], bool]


@dataclass(frozen=True)
class PlannedSource:
    """One source of a search: its position (source_at), the index it is asked through (None: flat), how many
    of its rows that index does not cover and are searched flat by Lance (0 with fast_search), whether only the
    index-covered fragments are searched, and the view (gap generations) its liveness is checked against."""

    position: int
    source: Source
    index: Any | None
    unindexed_rows: int
    fast_search: bool = False
    view: View = ()

    @property
    def rows_served_flat(self) -> int:
        return self.source.dataset.count_rows() if self.index is None else self.unindexed_rows


@dataclass
class SearchCost:
    """What a search on one column pays on this snapshot: sources asked through an index, sources and rows
    read flat (status and the lag monitor show it)."""

    column: str
    indexed_sources: int = 0
    flat_sources: int = 0
    rows_served_flat: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gap_sources(reader: LsmReader) -> list[Source]:
    """The gap generations opened on this snapshot; gap position = len(reader.sources) + list position."""
    return reader.search_cache.setdefault("gap sources", [])


def source_at(reader: LsmReader, position: int) -> Source:
    """The source at `position`: one of reader.sources, or a gap generation a plan opened."""
    n = len(reader.sources)
    return reader.sources[position] if position < n else _gap_sources(reader)[position - n]


def gap_positions(reader: LsmReader, index_name: str) -> View | None:
    """Positions of the generations in (index_catchup[index][region], merged_generations[region]] of every
    region, opened once per snapshot. Asked only when the base index leaves rows unindexed: an index absent
    from index_catchup then counts as at 0 everywhere, as GC and status read it (memwal.index_coverage).
    None when one of them is no longer listed (its rows are then only in the base's unindexed rows)."""
    cache = reader.search_cache
    key = ("gaps", index_name)
    if key in cache:
        return cache[key]
    catchup = reader.index_catchup.get(index_name, {})
    opened = cache.setdefault("gap positions", {})
    found: list[int] | None = []
    for region_id, manifest in reader.manifests.items():
        low, high = catchup.get(region_id, 0), reader.merged_generations.get(region_id, 0)
        listed = {fg.generation: fg for fg in manifest.flushed_generations}
        for gen in range(low + 1, high + 1):
            if gen not in listed:
                found = None
                break
            if (region_id, gen) not in opened:
                ds = open_generation(reader.store, region_id, gen, listed[gen].path, reader.base.schema)
                _gap_sources(reader).append(Source(region_id, gen, ds, True, listed[gen].path))
                opened[region_id, gen] = len(reader.sources) + len(_gap_sources(reader)) - 1
            found.append(opened[region_id, gen])
        if found is None:
            break
    cache[key] = None if found is None else tuple(found)
    return cache[key]


def upper_positions(reader: LsmReader, view: View = ()) -> list[int]:
    """Positions of every source above the base in the view: the reader's generations and MemTables, then the
    view's gap generations."""
    return [*range(1, len(reader.sources)), *view]


def _upper(reader: LsmReader, view: View) -> list[tuple[int, Source]]:
    return [(i, source_at(reader, i)) for i in upper_positions(reader, view)]


def live_addresses(reader: LsmReader, view: View = ()) -> dict[int, np.ndarray]:
    """Per source position: the sorted row addresses of its rows that are their key's newest live version in
    the reader's sources plus the gap generations `view` (unfiltered), computed once per view and snapshot.
    The base's (position 0) come from all its keys joined with the keys above it (memwal.newest_version)."""
    key = ("live", view)
    cache = reader.search_cache
    if key not in cache:
        upper = upper_view(reader, _upper(reader, view), view)
        keys = base_keys(reader)
        shadowed = shadowed_in_bulk(list(reader.pk), keys, upper.keys)
        base = np.sort(keys.column("_rowaddr").to_numpy().astype(np.uint64)[~shadowed])
        cache[key] = {0: base, **upper.live}
    return cache[key]


def is_live(reader: LsmReader, position: int, rows: pa.Table, view: View = (), check: NewerCheck | None = None
            ) -> np.ndarray:
    """Which of the given rows of source `position` (`_rowaddr`, and the key columns for the base's) are their
    key's newest live version: base rows through the bloom filters and keys above them (counted in `check`)."""
    if position == 0:
        return ~newer_versions(reader, rows.select(list(reader.pk)), _upper(reader, view), view, check)
    addrs = rows.column("_rowaddr").to_numpy().astype(np.uint64)
    return member(addrs, upper_view(reader, _upper(reader, view), view).live[position])


def source_index(reader: LsmReader, position: int, column: str, matches: IndexMatch) -> Any | None:
    """The source's index on `column` accepted by `matches` (a describe_indices entry), or None; cached."""
    key = ("index", position, column, matches)
    cache = reader.search_cache
    if key not in cache:
        ds = source_at(reader, position).dataset
        cache[key] = next((d for d in cached(ds, "indices", ds.describe_indices) if matches(d, column)), None)
    return cache[key]


def _index_stats(reader: LsmReader, position: int, index: Any) -> dict:
    key = ("index stats", position, index.name)
    cache = reader.search_cache
    if key not in cache:
        ds = source_at(reader, position).dataset
        cache[key] = cached(ds, ("index stats", index.name), lambda: index_statistics(ds, index.name))
    return cache[key]


def unindexed_rows(reader: LsmReader, position: int, index: Any) -> int:
    """Rows of source `position` its index does not cover (searched flat by Lance); cached."""
    return int(_index_stats(reader, position, index).get("num_unindexed_rows") or 0)


def index_partitions(reader: LsmReader, position: int, index: Any) -> int:
    """IVF partitions of a vector index (the largest over its segments; 1 when Lance does not say)."""
    found = [int(d.get("num_partitions") or 0) for d in _index_stats(reader, position, index).get("indices", [])
             if isinstance(d, dict)]
    return max([1, *found])


def source_rows(reader: LsmReader, position: int) -> int:
    """Rows of source `position` (Lance's count, deletions applied); cached per snapshot."""
    key = ("rows", position)
    if key not in reader.search_cache:
        ds = source_at(reader, position).dataset
        reader.search_cache[key] = cached(ds, "rows", ds.count_rows)
    return reader.search_cache[key]


def _unexplained(reader: LsmReader, index: Any, view: View) -> int:
    """Live base rows (in the view) that the base index does not cover: written outside MemWAL, or of a gap
    generation that is gone. Exact: the uncovered fragments' keys against the keys above the base; cached per
    view and snapshot."""
    key = ("unexplained", index.name, view)
    cache = reader.search_cache
    if key not in cache:
        covered = covered_fragments(reader.base, index.name) or set()
        uncovered = [f.fragment_id for f in reader.base.get_fragments() if f.fragment_id not in covered]
        found = 0
        if uncovered:
            pk = list(reader.pk)
            keys = cached(reader.base, ("keys outside", tuple(uncovered)), lambda: _base_keys_in(reader, uncovered))
            upper = upper_view(reader, _upper(reader, view), view)
            found = int((~shadowed_in_bulk(pk, keys, upper.keys)).sum())
        cache[key] = found
    return cache[key]


def _base_keys_in(reader: LsmReader, fragments: list[int]) -> pa.Table:
    """The base version's keys of these fragments (from `base_keys`: a row's fragment is its address's high half)."""
    keys = base_keys(reader)
    fragment = (keys.column("_rowaddr").to_numpy().astype(np.uint64) >> np.uint64(32)).astype(np.int64)
    return keys.filter(pa.array(np.isin(fragment, np.array(fragments, np.int64))))


def _base_plan(reader: LsmReader, index: Any, exact: bool) -> tuple[bool, View]:
    """Whether the base is searched over its indexed fragments only, and the gap generations added. exact:
    decided from the view's winners (a search); else from row counts (status: index metadata only)."""
    unindexed = unindexed_rows(reader, 0, index)
    if unindexed == 0:
        return True, ()
    view = gap_positions(reader, index.name)
    if view is None:
        return False, ()
    if exact:
        fast = _unexplained(reader, index, view) == 0
    else:
        fast = bool(view) and unindexed <= sum(source_rows(reader, p) for p in view)
    return (True, view) if fast else (False, ())


def plan_sources(reader: LsmReader, column: str, matches: IndexMatch, filter: Filter = None, exact: bool = True
                 ) -> list[PlannedSource]:
    """The sources a search on `column` asks (regions the filter excludes pruned), each with its index: the
    base, the gap generations of the base index (after the unmerged ones in position order) and the rest."""
    regions = reader.regions_for(filter)
    base_index = source_index(reader, 0, column, matches)
    fast, view = _base_plan(reader, base_index, exact) if base_index is not None else (False, ())
    planned = []
    for i in [*range(len(reader.sources)), *view]:
        source = source_at(reader, i)
        if regions is not None and source.region_id is not None and source.region_id not in regions:
            continue
        index = source_index(reader, i, column, matches)
        flat_rows = unindexed_rows(reader, i, index) if index is not None and not (i == 0 and fast) else 0
        planned.append(PlannedSource(i, source, index, flat_rows, i == 0 and fast, view))
    return planned


def search_cost(reader: LsmReader, column: str, matches: IndexMatch, flat_rows: int = 0) -> SearchCost:
    """SearchCost of a search on `column` over the reader's snapshot (no filter): cheap, index metadata only.
    Generations and MemTables of at most `flat_rows` rows count as read flat (the vector search does so)."""
    cost = SearchCost(column)
    for p in plan_sources(reader, column, matches, exact=False):
        if p.index is not None and p.source.generation > 0 and source_rows(reader, p.position) <= flat_rows:
            p = PlannedSource(p.position, p.source, None, 0)
        if p.index is None:
            cost.flat_sources += 1
        else:
            cost.indexed_sources += 1
        cost.rows_served_flat += p.rows_served_flat
    return cost


def is_vector_index(desc: Any, column: str) -> bool:
    """A describe_indices entry is a vector index (IVF_*, HNSW) on exactly `column`."""
    kind = str(desc.index_type).upper()
    return (kind.startswith("IVF") or "HNSW" in kind or "VECTOR" in kind) and list(desc.field_names) == [column]


def is_inverted_index(desc: Any, column: str) -> bool:
    """A describe_indices entry is a full-text (INVERTED) index on exactly `column`."""
    return str(desc.index_type).upper() == "INVERTED" and list(desc.field_names) == [column]
