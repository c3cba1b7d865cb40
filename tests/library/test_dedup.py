"""newest_per_key against the rule stated plainly: per primary key (NULL equal to NULL, as a group key),
the row with the highest (generation, row address) wins; both of its paths (rows already in version order,
and any order) are drawn."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN, newest_per_key

ROWS = st.lists(
    st.tuples(st.sampled_from([None, 1, 2, 3]), st.sampled_from([None, "a", "b"]), st.integers(1, 4),
              st.integers(0, 50)),
    max_size=30,
    unique_by=lambda r: (r[2], r[3]),  # (generation, row address) identifies a row version
)


@settings(max_examples=300, deadline=None)
@given(rows=ROWS, in_version_order=st.booleans())
def test_newest_per_key_keeps_the_highest_generation_then_row_address(rows, in_version_order):
    if in_version_order:
        rows = sorted(rows, key=lambda r: (r[2], r[3]))
    table = pa.table({
        "k1": pa.array([r[0] for r in rows], pa.int64()),
        "k2": pa.array([r[1] for r in rows], pa.string()),
        "v": pa.array(range(len(rows)), pa.int64()),
        GEN_COLUMN: pa.array([r[2] for r in rows], pa.int64()),
        ROWADDR_COLUMN: pa.array([r[3] for r in rows], pa.uint64()),
    })
    newest: dict[tuple, dict] = {}
    for r in table.to_pylist():
        key = (r["k1"], r["k2"])
        if key not in newest or (r[GEN_COLUMN], r[ROWADDR_COLUMN]) > (newest[key][GEN_COLUMN],
                                                                        newest[key][ROWADDR_COLUMN]):
            newest[key] = r
    got = newest_per_key(table, ["k1", "k2"]).to_pylist()
    assert sorted(r["v"] for r in got) == sorted(r["v"] for r in newest.values()), (
        "one row per key (NULL keys included), the newest version")


@settings(max_examples=300, deadline=None)
@given(rows=ROWS, in_version_order=st.booleans(), key_type=st.sampled_from([pa.int64(), pa.int32(), pa.uint16()]),
       split=st.integers(0, 30))
def test_one_integer_key_keeps_the_newest_version_on_every_path(rows, in_version_order, key_type, split):
    """One integer key (the numpy path without NULLs, the hash path with them), over several chunks."""
    if in_version_order:
        rows = sorted(rows, key=lambda r: (r[2], r[3]))
    table = pa.table({
        "k": pa.array([r[0] for r in rows], key_type),
        "v": pa.array(range(len(rows)), pa.int64()),
        GEN_COLUMN: pa.array([r[2] for r in rows], pa.int64()),
        ROWADDR_COLUMN: pa.array([r[3] for r in rows], pa.uint64()),
    })
    table = pa.concat_tables([table.slice(0, split), table.slice(split)])
    newest: dict = {}
    for r in table.to_pylist():
        if r["k"] not in newest or (r[GEN_COLUMN], r[ROWADDR_COLUMN]) > (newest[r["k"]][GEN_COLUMN],
                                                                        newest[r["k"]][ROWADDR_COLUMN]):
            newest[r["k"]] = r
    got = newest_per_key(table, ["k"]).to_pylist()
    assert sorted(r["v"] for r in got) == sorted(r["v"] for r in newest.values())
    if in_version_order:
        assert [r["v"] for r in got] == sorted(r["v"] for r in got), "in the rows' own order"
