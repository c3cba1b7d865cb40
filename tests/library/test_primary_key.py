"""The primary key as Lance reads it: either marker, positioned columns first, composite keys, and one
clear error for metadata that contradicts itself."""

from __future__ import annotations

import re
import uuid

import lance
import pyarrow as pa
import pytest

from memwal.errors import BadInputError, InvalidPrimaryKeyError, NoPrimaryKeyError
from memwal.primary_key import primary_key_columns
from memwal.reader import LsmReader
from memwal.writer import RegionWriter

MARK = "lance-schema:unenforced-primary-key"
POS = "lance-schema:unenforced-primary-key:position"


def schema(**columns: dict) -> pa.Schema:
    return pa.schema([pa.field(name, pa.int64(), nullable=False, metadata=meta or None)
                      for name, meta in columns.items()])


def test_boolean_marker_alone_makes_the_key():
    assert primary_key_columns(schema(id={MARK: "true"}, v={})) == ["id"]
    assert primary_key_columns(schema(id={MARK: "TRUE"}, v={})) == ["id"]


def test_position_alone_makes_the_key_as_lancedb_writes_it():
    assert primary_key_columns(schema(v={}, id={POS: "1"})) == ["id"], \
        "LanceDB's set_unenforced_primary_key writes only the :position marker"


def test_positioned_columns_first_by_position_then_marked_ones_in_field_order():
    s = schema(a={MARK: "true"}, b={POS: "2"}, c={POS: "1"}, d={POS: "0"}, e={}, f={MARK: "true", POS: "3"})
    assert primary_key_columns(s) == ["c", "b", "f", "a", "d"]


def test_marker_false_alone_is_not_in_the_key():
    assert primary_key_columns(schema(a={MARK: "false"}, b={MARK: "true"})) == ["b"]
    with pytest.raises(NoPrimaryKeyError, match=r"tbl has no primary key.*:position"):
        primary_key_columns(schema(a={MARK: "false"}, b={}), where="tbl")


@pytest.mark.parametrize(("columns", "named"), [
    ({"a": {POS: "abc"}}, ["'a'", "'abc'"]),
    ({"a": {POS: "-1"}}, ["'a'", "'-1'"]),
    ({"a": {POS: "1.5"}}, ["'a'", "'1.5'"]),
    ({"a": {POS: ""}}, ["'a'"]),
    ({"a": {POS: "1"}, "b": {POS: "1"}}, ["'a'", "'b'", "position 1"]),
    ({"a": {MARK: "false", POS: "1"}}, ["'a'", "'false'"]),
    ({"a": {MARK: "yes"}}, ["'a'", "'yes'"]),
], ids=["not-a-number", "negative", "fraction", "empty", "duplicate-position", "false-with-position",
        "marker-not-boolean"])
def test_contradicting_metadata_is_one_error_naming_table_and_columns(columns, named):
    with pytest.raises(InvalidPrimaryKeyError) as err:
        primary_key_columns(schema(**columns, v={}), where="s3://b/t.lance")
    message = str(err.value)
    assert message.startswith("s3://b/t.lance: "), message
    for word in named:
        assert word in message, f"{word} missing from {message!r}"


def test_composite_key_matches_the_key_pylance_merges_on(tmp_path):
    """b (position 1), a (position 2), v not in the key: pylance 14's merge_insert with no `on` (its own
    key) and merge_insert on our key columns give the same table (rows (1,1) and (1,2) differ in a)."""
    s = pa.schema([pa.field("a", pa.int64(), nullable=False, metadata={POS: "2"}),
                   pa.field("v", pa.string()),
                   pa.field("b", pa.int64(), nullable=False, metadata={POS: "1"})])
    assert primary_key_columns(s) == ["b", "a"]
    base = pa.table({"a": [1, 2, 1], "v": ["x", "y", "z"], "b": [1, 1, 2]}, schema=s)
    new = pa.table({"a": [2, 3], "v": ["updated", "inserted"], "b": [1, 1]}, schema=s)
    results = []
    for name, on in (("lance", []), ("ours", primary_key_columns(s))):
        ds = lance.write_dataset(base, str(tmp_path / name))
        ds.merge_insert(on).when_matched_update_all().when_not_matched_insert_all().execute(new)
        results.append(sorted(lance.dataset(str(tmp_path / name)).to_table().to_pylist(),
                              key=lambda r: (r["b"], r["a"])))
    assert results[0] == results[1], "our key must be the one Lance merges on"
    assert {r["v"] for r in results[0]} == {"x", "updated", "z", "inserted"}


def test_a_table_with_contradicting_key_metadata_is_refused_naming_it(tmp_path):
    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"a": [1], "b": [2]}, schema=schema(a={POS: "1"}, b={POS: "1"})), uri)
    with pytest.raises(InvalidPrimaryKeyError, match=f"{uri}: columns 'a' and 'b' both have"):
        RegionWriter(uri, "00000000-0000-0000-0000-000000000001")


# A key column Lance 14 lets be null: its write-time check does not read " 1" as a position, its MemWAL
# writer does (issue 41, item 8).
NULLABLE_KEY = pa.field("id", pa.int64(), nullable=True, metadata={POS: " 1"})
NOT_NULL_KEY = pa.field("id", pa.int64(), nullable=False, metadata={MARK: "true"})
DIM = 2


def _null_key_base(uri: str, key: pa.Field, ids: list) -> None:
    """Base (id, name, vec) with an INVERTED index on name, MemWAL initialized; every name holds 'apple'."""
    s = pa.schema([key, pa.field("name", pa.string()), pa.field("vec", pa.list_(pa.float32(), DIM))])
    t = pa.table({"id": pa.array(ids, pa.int64()), "name": [f"apple {i}" for i in range(len(ids))],
                  "vec": [[float(i), 0.0] for i in range(len(ids))]}, schema=s)
    lance.write_dataset(t, uri).create_scalar_index("name", "INVERTED", name="name_idx")
    lance.dataset(uri).initialize_mem_wal(unsharded=True)


READS = {
    "scan": lambda r: r.scan(),
    "vector search": lambda r: r.search([0.0, 0.0], k=3),
    "full-text search": lambda r: r.full_text_search("apple", k=10),
}


@pytest.mark.parametrize("key", [NULLABLE_KEY, NOT_NULL_KEY], ids=["nullable", "not-null"])
def test_the_writer_refuses_a_null_key_naming_table_region_and_column(tmp_path, key):
    uri = str(tmp_path / "t")
    _null_key_base(uri, key, [1, 2])
    region = str(uuid.uuid4())
    with RegionWriter(uri, region) as w:
        where = re.escape(f"table {w.table_uri} region {region}: primary key column 'id' has 1 null")
        with pytest.raises(ValueError, match=where):
            w.put(pa.table({"id": pa.array([5, None], pa.int64()), "name": ["a", "b"], "vec": [[1.0, 1.0]] * 2}))
        with pytest.raises(ValueError, match=where):
            w.delete(pa.table({"id": pa.array([None], pa.int64())}))
        assert w.stats.wal_entries == 0, "a refused write reached the WAL"
    assert sorted(LsmReader(uri).scan(columns=["id"]).column("id").to_pylist()) == [1, 2]


@pytest.mark.parametrize("read", list(READS))
def test_a_base_with_a_null_key_is_refused_by_every_read_naming_table_and_column(tmp_path, read):
    uri = str(tmp_path / "t")
    _null_key_base(uri, NULLABLE_KEY, [1, None, 3])
    with pytest.raises(BadInputError, match=r"/t \(base version 3\): primary key column 'id' has 1 null"):
        READS[read](LsmReader(uri))


@pytest.mark.parametrize("read", list(READS))
def test_a_generation_with_a_null_key_is_refused_by_every_read_naming_region_and_generation(tmp_path, read):
    """Lance core's own MemWAL writer takes a null key on this table and flushes it; our reads refuse it."""
    uri = str(tmp_path / "t")
    _null_key_base(uri, NULLABLE_KEY, [1, 2, 3])
    region = str(uuid.uuid4())
    with lance.dataset(uri).mem_wal_writer(region, max_memtable_rows=2) as w:
        w.put(pa.table({"id": pa.array([2, None], pa.int64()), "name": ["apple new", "apple null"],
                        "vec": [[0.0, 0.0]] * 2}, schema=lance.dataset(uri).schema))
    with pytest.raises(BadInputError, match=rf"region {region} generation 1: primary key column 'id' has 1 null"):
        READS[read](LsmReader(uri))
