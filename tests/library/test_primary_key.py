"""The primary key as Lance reads it: either marker, positioned columns first, composite keys, and one
clear error for metadata that contradicts itself."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from memwal.errors import InvalidPrimaryKeyError, NoPrimaryKeyError
from memwal.primary_key import primary_key_columns
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
