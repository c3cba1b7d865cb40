"""What a vector or full-text search pays right now, per searched index of a table (status, the lag monitor):
sources asked through an index, sources read flat, rows served flat (memwal.search_plan)."""

from __future__ import annotations

from typing import Any

from memwal.reader import LsmReader
from memwal.search_plan import is_inverted_index, is_vector_index, search_cost
from memwal.vector_search import FLAT_ROWS

__all__ = ["search_costs"]


def _searched_index(desc: Any) -> str | None:
    """'vector' or 'fts' for a single-column index a search uses, else None."""
    if len(desc.field_names) != 1:
        return None
    if is_vector_index(desc, desc.field_names[0]):
        return "vector"
    return "fts" if str(desc.index_type).upper() == "INVERTED" else None


def search_costs(table: Any) -> list[dict[str, Any]]:
    """What a vector or full-text search pays right now on the table's latest snapshot (no MemTables), per
    searched index of the base table: SearchCost with the index's name and kind (status and the lag monitor)."""
    reader = LsmReader(table)
    out = []
    for desc in reader.base.describe_indices():
        kind = _searched_index(desc) if desc.field_names else None
        if kind is None:
            continue
        if kind == "vector":  # a generation searched flat by size counts as flat, whatever index it carries
            cost = search_cost(reader, desc.field_names[0], is_vector_index, FLAT_ROWS)
        else:
            cost = search_cost(reader, desc.field_names[0], is_inverted_index)
        out.append({"index": desc.name, "kind": kind, **cost.to_dict()})
    return out
