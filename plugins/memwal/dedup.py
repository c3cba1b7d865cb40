"""Newest version per primary key: highest generation, then highest row address (memwal-spec.txt,
LSM Tree Merging Read). Shared by the LSM reader and the merge."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["GEN_COLUMN", "ROWADDR_COLUMN", "SOURCE_COLUMN", "newest_per_key"]

GEN_COLUMN = "__memwal_gen"
ROWADDR_COLUMN = "__memwal_rowaddr"
SOURCE_COLUMN = "__memwal_src"  # which source (an LsmReader position) a row came from


def newest_per_key(rows: pa.Table, pk: Sequence[str]) -> pa.Table:
    """One row per primary key: the one with the highest (GEN_COLUMN, ROWADDR_COLUMN)."""
    n = rows.num_rows
    if n <= 1:
        return rows
    if _in_version_order(rows):
        return _last_per_key(rows, pk)
    order = [(c, "ascending") for c in pk] + [(GEN_COLUMN, "descending"), (ROWADDR_COLUMN, "descending")]
    rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    same = np.ones(n - 1, bool)
    for c in pk:
        col = rows.column(c).combine_chunks()
        after, before = col.slice(1), col.slice(0, n - 1)
        eq = pc.or_kleene(pc.equal(after, before), pc.and_(pc.is_null(after), pc.is_null(before)))
        same &= pc.fill_null(eq, False).to_numpy(zero_copy_only=False)
    first = np.ones(n, bool)
    first[1:] = ~same
    return rows.filter(pa.array(first))


def _in_version_order(rows: pa.Table) -> bool:
    """Rows already ascending by (generation, row address), as the merge reads them (generations in
    order, each scanned in row-address order): then the newest version of a key is its last row."""
    g = rows.column(GEN_COLUMN).to_numpy()
    r = rows.column(ROWADDR_COLUMN).to_numpy()
    return bool(np.all((g[1:] > g[:-1]) | ((g[1:] == g[:-1]) & (r[1:] > r[:-1]))))


_POS = "__memwal_pos"


def _last_per_key(rows: pa.Table, pk: Sequence[str]) -> pa.Table:
    """The last row of each key, by a hash aggregation instead of a sort (O(n)); rows in original order.
    One integer key without nulls: a stable numpy argsort (a merge's batch of 22,000 rows in 0.4 ms instead
    of 5.5, no slower at millions of rows; issue 44)."""
    if len(pk) == 1 and pa.types.is_integer(rows.schema.field(pk[0]).type) and rows.column(pk[0]).null_count == 0:
        return _last_per_integer_key(rows, rows.column(pk[0]).to_numpy())
    keys = rows.select(list(pk)).append_column(_POS, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    last = keys.group_by(list(pk), use_threads=True).aggregate([(_POS, "max")]).column(f"{_POS}_max")
    return rows.take(pa.array(np.sort(last.to_numpy())))


def _last_per_integer_key(rows: pa.Table, keys: np.ndarray) -> pa.Table:
    """`_last_per_key` of a one-column integer key: the last position of each key in a stable sort by key."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    last = np.ones(len(keys), bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    picked = order[last]
    return rows if len(picked) == len(keys) else rows.take(pa.array(np.sort(picked)))
