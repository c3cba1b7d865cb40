"""Newest version per primary key: highest generation, then highest row address (memwal-spec.txt,
LSM Tree Merging Read). Shared by the LSM reader and the merge."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["GEN_COLUMN", "ROWADDR_COLUMN", "newest_per_key"]

GEN_COLUMN = "__memwal_gen"
ROWADDR_COLUMN = "__memwal_rowaddr"


def newest_per_key(rows: pa.Table, pk: Sequence[str]) -> pa.Table:
    """One row per primary key: the one with the highest (GEN_COLUMN, ROWADDR_COLUMN)."""
    n = rows.num_rows
    if n <= 1:
        return rows
    order = [(c, "ascending") for c in pk] + [(GEN_COLUMN, "descending"), (ROWADDR_COLUMN, "descending")]
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    same = np.ones(n - 1, bool)
    for c in pk:
        col = rows.column(c).combine_chunks()
        after, before = col.slice(1), col.slice(0, n - 1)
        eq = pc.or_(pc.equal(after, before), pc.and_(pc.is_null(after), pc.is_null(before)))
        same &= pc.fill_null(eq, False).to_numpy(zero_copy_only=False)
    first = np.ones(n, bool)
    first[1:] = ~same
    return rows.filter(pa.array(first))
