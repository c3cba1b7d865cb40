"""The indexed read plan shared by the LSM searches (vector, full-text): which sources a search asks, through
which index, and the newest-version check every candidate passes (memwal-spec.txt, Indexed Read Plan).

Sources are those of an open LsmReader snapshot: the base table (its indexed fragments through the index;
rows the index does not cover yet, e.g. generations merged but not caught up, are served flat by Lance and
counted), every generation above merged_generations, and the MemTables the caller passed; regions the filter
excludes (`col = v` terms) are pruned. A candidate row is returned only if it is its key's newest live
version: the snapshot's winners (newest generation, then row address, tombstones hide) are computed once per
snapshot and cached on the reader with the opened index descriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from memwal.dedup import ROWADDR_COLUMN as _ADDR
from memwal.dedup import SOURCE_COLUMN as _SRC

if TYPE_CHECKING:
    from memwal.reader import Filter, LsmReader, Source

__all__ = ["PlannedSource", "SearchCost", "is_inverted_index", "is_live", "is_vector_index", "live_addresses",
           "member", "plan_sources", "search_cost", "source_index", "unindexed_rows"]

IndexMatch = Callable[[Any, str], bool]


@dataclass(frozen=True)
class PlannedSource:
    """One source of a search: its position in reader.sources, the index it is asked through (None: flat) and
    how many of its rows that index does not cover (searched flat by Lance)."""

    position: int
    source: Source
    index: Any | None
    unindexed_rows: int

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


def member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """values[i] in sorted_set, vectorised."""
    if len(sorted_set) == 0:
        return np.zeros(len(values), bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[pos] == values


def live_addresses(reader: LsmReader) -> dict[int, np.ndarray]:
    """Per source position: the sorted row addresses of its rows that are their key's newest live version
    (the whole view, unfiltered), computed once per snapshot."""
    cache = reader._search_cache
    if "live" not in cache:
        winners = reader._winners(list(enumerate(reader.sources)))
        src = winners.column(_SRC).to_numpy()
        addr = winners.column(_ADDR).to_numpy().astype(np.uint64)
        cache["live"] = {i: np.sort(addr[src == i]) for i in range(len(reader.sources))}
    return cache["live"]


def is_live(reader: LsmReader, position: int, addresses: np.ndarray) -> np.ndarray:
    """Which of the given row addresses of source `position` are their key's newest live version."""
    return member(np.asarray(addresses, np.uint64), live_addresses(reader)[position])


def source_index(reader: LsmReader, position: int, column: str, matches: IndexMatch) -> Any | None:
    """The source's index on `column` accepted by `matches` (a describe_indices entry), or None; cached."""
    key = ("index", position, column, matches)
    cache = reader._search_cache
    if key not in cache:
        ds = reader.sources[position].dataset
        cache[key] = next((d for d in ds.describe_indices() if matches(d, column)), None)
    return cache[key]


def unindexed_rows(reader: LsmReader, position: int, index: Any) -> int:
    """Rows of source `position` its index does not cover (searched flat by Lance); cached."""
    key = ("unindexed", position, index.name)
    cache = reader._search_cache
    if key not in cache:
        stats = reader.sources[position].dataset.stats.index_stats(index.name)
        cache[key] = int(stats.get("num_unindexed_rows") or 0)
    return cache[key]


def plan_sources(reader: LsmReader, column: str, matches: IndexMatch, filter: Filter = None
                 ) -> list[PlannedSource]:
    """The sources a search on `column` asks (regions the filter excludes pruned), each with its index."""
    regions = reader._regions_for(filter)
    planned = []
    for i, source in enumerate(reader.sources):
        if regions is not None and source.region_id is not None and source.region_id not in regions:
            continue
        index = source_index(reader, i, column, matches)
        planned.append(PlannedSource(i, source, index, unindexed_rows(reader, i, index) if index else 0))
    return planned


def search_cost(reader: LsmReader, column: str, matches: IndexMatch, flat_rows: int = 0) -> SearchCost:
    """SearchCost of a search on `column` over the reader's snapshot (no filter): cheap, index metadata only.
    Generations and MemTables of at most `flat_rows` rows count as read flat (the vector search does so)."""
    cost = SearchCost(column)
    for p in plan_sources(reader, column, matches):
        if p.index is not None and p.source.generation > 0 and p.source.dataset.count_rows() <= flat_rows:
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
