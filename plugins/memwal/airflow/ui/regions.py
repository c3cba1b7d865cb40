"""The region rows of the page: `memwal status` per region, with the table's thresholds applied.

One row per region, in the words of `memwal status --json` (writer epoch, current, flushed and merged
generation, unmerged rows and bytes, age of the oldest unmerged generation, index lag) plus the age of
the table's region snapshot; `over` names every column above the table's threshold. `index_rows`: the
same for each index's health (`memwal.index_health`: segments, unindexed rows). `SEARCH_COLUMNS`: what a
search pays now per searched index (`memwal.search_costs`, as `memwal status --search` prints it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COLUMNS", "INDEX_COLUMNS", "SEARCH_COLUMNS", "TableView", "index_rows", "region_rows", "threshold"]

#: (key in a row, heading, threshold key in the tables file or None)
COLUMNS: list[tuple[str, str, str | None]] = [
    ("region_id", "Region", None),
    ("writer_epoch", "Writer epoch", None),
    ("current_generation", "Current gen", None),
    ("flushed_generation", "Flushed gen", None),
    ("merged_generation", "Merged gen", None),
    ("unmerged_generations", "Unmerged gens", "max_unmerged_generations"),
    ("unmerged_rows", "Unmerged rows", None),
    ("unmerged_bytes", "Unmerged bytes", "max_unmerged_bytes"),
    ("oldest_unmerged_age_s", "Oldest unmerged", "max_oldest_unmerged_age_s"),
    ("index_lag_generations", "Index lag", "max_index_lag"),
    ("snapshot_age_s", "Snapshot age", "max_snapshot_age_s"),
]

#: the index health table: (key in a row, heading, threshold key or None)
INDEX_COLUMNS: list[tuple[str, str, str | None]] = [
    ("name", "Index", None),
    ("index_type", "Type", None),
    ("segments", "Segments", "max_index_segments"),
    ("indexed_rows", "Indexed rows", None),
    ("unindexed_rows", "Unindexed rows", "max_unindexed_rows"),
    ("unindexed_fragments", "Unindexed fragments", None),
]

#: the search cost table, one row per vector or FTS index of the base table: (key in a search_costs entry, heading)
SEARCH_COLUMNS: list[tuple[str, str]] = [
    ("index", "Index"),
    ("kind", "Search"),
    ("column", "Column"),
    ("indexed_sources", "Sources through an index"),
    ("flat_sources", "Flat sources"),
    ("rows_served_flat", "Rows served flat"),
]


def threshold(thresholds: Any, key: str) -> float | None:
    """A threshold from the table config (a mapping or an object with attributes); None when unset."""
    if thresholds is None:
        return None
    value = thresholds.get(key) if isinstance(thresholds, dict) else getattr(thresholds, key, None)
    return None if value is None else float(value)


def region_rows(
    status: dict, thresholds: Any, snapshot_ts_millis: int | None, now: float | None = None
) -> list[dict]:
    """Rows for the page from a `memwal status --json` summary (TableStatus.to_dict())."""
    now = time.time() if now is None else now
    snapshot_age = None if not snapshot_ts_millis else max(0.0, now - snapshot_ts_millis / 1000.0)
    rows = []
    for r in status.get("regions", []):
        flushed = r.get("flushed_generations") or []
        row = {
            "region_id": r["region_id"],
            "writer_epoch": r.get("writer_epoch"),
            "current_generation": r.get("current_generation"),
            "flushed_generation": max(flushed) if flushed else None,
            "merged_generation": r.get("merged_generation"),
            "unmerged_generations": r.get("unmerged_generations"),
            "unmerged_rows": r.get("unmerged_rows"),
            "unmerged_bytes": r.get("unmerged_bytes"),
            "oldest_unmerged_age_s": r.get("oldest_unmerged_age_s"),
            "index_lag_generations": r.get("index_lag_generations"),
            "snapshot_age_s": snapshot_age,
            "error": r.get("error") or r.get("flush_failure"),
        }
        row["over"] = [
            key for key, _, tkey in COLUMNS
            if tkey is not None and row[key] is not None
            and (limit := threshold(thresholds, tkey)) is not None and row[key] > limit
        ]
        rows.append(row)
    return rows


def index_rows(status: dict, thresholds: Any) -> list[dict]:
    """Rows of the index health table from the status' `indexes`, `over` naming the columns above limits."""
    rows = []
    for i in status.get("indexes") or []:
        row = {key: i.get(key) for key, _, _ in INDEX_COLUMNS}
        row["over"] = [key for key, _, tkey in INDEX_COLUMNS
                       if tkey is not None and row[key] is not None
                       and (limit := threshold(thresholds, tkey)) is not None and row[key] > limit]
        rows.append(row)
    return rows


@dataclass
class TableView:
    """Everything the page shows for one configured table."""

    name: str
    uri: str
    regions: list[dict] = field(default_factory=list)
    indexes: list[dict] = field(default_factory=list)
    search: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    error: str | None = None
    chart: str = ""
    limits: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def regions_over(self) -> int:
        return sum(1 for r in self.regions if r["over"] or r["error"])
