"""Issue 41 item 9: a key lives in the one region its region spec names (memwal-spec.txt "MemWAL Region"); the
region writer refuses a put with a row of another region, naming the table, region, spec, column and value,
and writes nothing of it (memwal.region_rows)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from memwal import naming
from memwal.errors import BadInputError
from memwal.field_ids import source_names_from_schema
from memwal.mem_wal_index import load_index
from memwal.region_ids import lancedb_shard_id, region_id_for
from memwal.region_rows import differing_rows
from memwal.table_writer import TableWriter
from memwal.transforms import evaluate
from memwal.writer import RegionWriter, WriterConfig

from support.tables import create_base, open_base, rows

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def _bucket_table(loc, buckets: int = 2):
    """Base ids 0..9 with Lance core's bucket(id, buckets) spec; its spec and each key's bucket."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(bucket_column="id", num_buckets=buckets)
    details = load_index(loc.uri).details
    spec = details.region_spec(details.newest_region_spec_id)
    keys = range(100, 200)
    values = evaluate(spec, rows(keys), source_names_from_schema(open_base(loc).schema)).column(0).to_pylist()
    by_bucket = {b: [k for k, v in zip(keys, values, strict=True) if v == b] for b in range(buckets)}
    return spec, by_bucket


def _wal_entries(loc, region: str) -> int:
    return len(loc.store().list_files(naming.wal_dir(region)))


def test_a_put_with_a_row_of_another_bucket_is_refused_and_nothing_is_written(local_location):
    """
    bucket(id, 2) | a hand-named region (UUID v4) takes bucket 0's keys | a put mixing a bucket-1 key in is
    refused as a whole: BadInputError naming table, region, spec 1, column id, the key and its region |
    no WAL entry, nothing in the MemTable | the region's own keys still go in.
    """
    loc = local_location
    spec, by_bucket = _bucket_table(loc)
    zero, one = by_bucket[0], by_bucket[1]
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(rows(zero[:3], "a"))
        entries = _wal_entries(loc, region)
        with pytest.raises(BadInputError) as refused:
            w.put(rows([zero[3], one[0]], "b"))
        message = str(refused.value)
        for part in (loc.uri, f"region {region}", "region spec 1", f"id = {one[0]}",
                     f"belongs to region {lancedb_shard_id(spec, [1])}", "merge order"):
            assert part in message, (part, message)
        assert isinstance(refused.value, ValueError)
        assert _wal_entries(loc, region) == entries and w.memtable_table().num_rows == 3, "nothing written"
        w.put(rows(zero[3:6], "c"))
        assert w.memtable_table().num_rows == 6


def test_the_first_put_to_a_fresh_region_must_be_of_one_region(local_location):
    """A fresh hand-named region takes its values from its first row: a first put of two buckets is refused."""
    loc = local_location
    _, by_bucket = _bucket_table(loc)
    with RegionWriter(loc.uri, str(uuid.uuid4()), config=NEVER) as w:
        with pytest.raises(BadInputError, match=f"id = {by_bucket[1][0]}"):
            w.put(rows([by_bucket[0][0], by_bucket[1][0]]))
        assert w.memtable_table().num_rows == 0


def test_a_region_named_after_its_values_takes_only_those(local_location):
    """A region named after bucket 0 (LanceDB's shard id, our TableWriter's; or the older region_id_for form)
    refuses bucket-1 rows even as its first put."""
    loc = local_location
    spec, by_bucket = _bucket_table(loc)
    for region in (lancedb_shard_id(spec, [0]), region_id_for(spec.spec_id, [0])):
        with RegionWriter(loc.uri, region, config=NEVER) as w:
            with pytest.raises(BadInputError, match=f"id = {by_bucket[1][0]}"):
                w.put(rows(by_bucket[1][:2]))
            w.put(rows(by_bucket[0][:2]))


def test_a_reopened_region_keeps_the_values_of_the_rows_it_holds(local_location):
    """Bucket 0's keys flushed, the writer closed | a new writer of the region refuses bucket 1's keys (its
    values come from the generation it holds), and so does one after a put only in its WAL (MemTable)."""
    loc = local_location
    _, by_bucket = _bucket_table(loc)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(rows(by_bucket[0][:2]))
    with pytest.raises(BadInputError, match=f"id = {by_bucket[1][0]}"):
        RegionWriter(loc.uri, region, config=NEVER).put(rows(by_bucket[1][:1]))
    other = str(uuid.uuid4())
    w = RegionWriter(loc.uri, other, config=NEVER)
    w.put(rows(by_bucket[1][:1]))  # in the WAL only: the next writer replays it into its MemTable
    w._closed = True  # a writer that stopped without flushing
    with pytest.raises(BadInputError, match=f"id = {by_bucket[0][0]}"):
        RegionWriter(loc.uri, other, config=NEVER).put(rows(by_bucket[0][:1]))


def test_the_table_writer_routes_every_key_into_its_region(local_location):
    """The TableWriter's puts pass the check: each part goes to the region named after its values."""
    loc = local_location
    spec, by_bucket = _bucket_table(loc)
    with TableWriter(loc.uri, config=NEVER) as tw:
        tw.put(rows(range(100, 140), "t"))
        assert set(tw.writers) == {lancedb_shard_id(spec, [0]), lancedb_shard_id(spec, [1])}
        for b in (0, 1):
            held = set(tw.writers[lancedb_shard_id(spec, [b])].memtable_table().column("id").to_pylist())
            assert held == {k for k in by_bucket[b] if k < 140}


def test_manual_regions_and_an_unsharded_spec_take_any_row(local_location):
    """A manual region (spec id 0) has no values to check; under an unsharded spec every row has one value.
    Two regions writing one key are then the writer's choice (docs/library.md: merge order decides)."""
    loc = local_location
    _bucket_table(loc)
    with RegionWriter(loc.uri, str(uuid.uuid4()), config=NEVER, region_spec_id=0) as w:
        w.put(rows(range(100, 140)))
        assert w.manifest.region_spec_id == 0 and w.memtable_table().num_rows == 40
    loc2 = type(loc)(loc.kind, loc.uri + "-2", None)
    create_base(loc2)
    open_base(loc2).initialize_mem_wal(unsharded=True)
    for _ in range(2):
        with RegionWriter(loc2.uri, str(uuid.uuid4()), config=NEVER) as w:
            w.put(rows(range(100, 140)))
            assert w.manifest.region_spec_id == 1 and w.memtable_table().num_rows == 40


def test_differing_rows_compares_nulls_and_nans_as_values():
    values = pa.table({"a": pa.array([1, None, 1], pa.int32()), "b": pa.array([float("nan"), float("nan"), 2.0])})
    assert differing_rows(values, (1, float("nan"))).to_pylist() == [False, True, True]
    assert differing_rows(values.slice(0, 1), (1, float("nan"))) is None
    assert differing_rows(values.slice(1, 1), (None, float("nan"))) is None
