"""The fleet overview: every configured table in one list, worst lag first and paged, from the rows the lag
monitor saved in its last cycle (`memwal.airflow.fleet_status`); no table is opened, so a page of 50 out of
1,000 tables costs one Variable read and the tables file's parse.

"Worst first" (sort=lag): a table that could not be measured or probed (storage error, corrupt manifest,
permissions, a bad tables-file entry), then the most breached thresholds, then the oldest unmerged
generation, then the most unmerged generations; tables the monitor has not measured yet come last.
sort=due: the most due jobs first; sort=name: by name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memwal.airflow.fleet_status import row_of

__all__ = ["DEFAULT_PER_PAGE", "MAX_PER_PAGE", "SORTS", "FleetPage", "fleet_page", "sort_rows"]

DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 500
SORTS = ("lag", "due", "name")


@dataclass
class FleetPage:
    """One page of the overview: its rows and where it is in the whole list."""

    rows: list[dict[str, Any]]
    total: int
    page: int
    pages: int
    per_page: int
    sort: str
    query: str
    measured_at: str | None
    counts: dict[str, int] = field(default_factory=dict)


def _failed(row: Mapping[str, Any]) -> bool:
    return bool(row.get("error")) or (row.get("probe") or {}).get("status") not in (None, "ok")


def state_of(row: Mapping[str, Any]) -> str:
    """error | behind | due | ok | unmeasured: the badge of a row."""
    if row.get("unmeasured"):
        return "unmeasured"
    if _failed(row):
        return "error"
    if row.get("breaches"):
        return "behind"
    return "due" if (row.get("probe") or {}).get("due") else "ok"


def _lag_key(row: Mapping[str, Any]) -> tuple:
    return (bool(row.get("unmeasured")), not _failed(row), -len(row.get("breaches") or []),
            -(row.get("oldest_unmerged_age_s") or 0.0), -(row.get("unmerged_generations") or 0), row["table"])


def sort_rows(rows: list[dict[str, Any]], sort: str = "lag") -> list[dict[str, Any]]:
    """The rows in the overview's order (`SORTS`; ValueError naming the parameter for another)."""
    if sort == "lag":
        return sorted(rows, key=_lag_key)
    if sort == "due":
        return sorted(rows, key=lambda r: (bool(r.get("unmeasured")), -len((r.get("probe") or {}).get("due") or []),
                                           _lag_key(r)))
    if sort == "name":
        return sorted(rows, key=lambda r: r["table"])
    raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")


def fleet_page(configured: Mapping[str, Any], bad: Mapping[str, Any], stored: Mapping[str, Mapping[str, Any]],
               measured_at: str | None, *, page: int = 1, per_page: int = DEFAULT_PER_PAGE, sort: str = "lag",
               query: str = "") -> FleetPage:
    """The page `page` (1-based; past the last: the last) of the configured tables (configured: name -> its
    config; bad: name -> its tables-file error), each with its stored row (`fleet_status.row_of`) or marked
    unmeasured. A stored row of a table no longer configured is left out, except the fleet probe's rows of tables
    it found under a root (`from_probe_only`: not in the tables file by name, and overwritten every cycle)."""
    if per_page < 1 or per_page > MAX_PER_PAGE:
        raise ValueError(f"per_page must be 1 to {MAX_PER_PAGE}, not {per_page}")
    rows = []
    found = {name for name, row in stored.items() if row.get("from_probe_only")}
    for name in sorted({*configured, *bad, *found}):
        if query and query.lower() not in name.lower():
            continue
        row = dict(stored.get(name) or {**row_of({"table": name}, getattr(configured.get(name), "uri", None)),
                                         "unmeasured": True})
        if name in bad:  # the tables file says now what is wrong, whatever the last cycle saw
            row.update(error=f"tables file: {bad[name]}", unmeasured=False)
        row["state"] = state_of(row)
        rows.append(row)
    ordered = sort_rows(rows, sort)
    pages = max(1, math.ceil(len(ordered) / per_page))
    page = min(max(1, page), pages)
    counts: dict[str, int] = {}
    for row in ordered:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return FleetPage(rows=ordered[(page - 1) * per_page: page * per_page], total=len(ordered), page=page,
                     pages=pages, per_page=per_page, sort=sort, query=query, measured_at=measured_at, counts=counts)
