"""Our LSM reader and Lance core's (LsmScanner, LsmPointLookupPlanner) agree on real files, both ways."""

import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lance.mem_wal import LsmPointLookupPlanner, LsmScanner

from memwal.reader import LsmReader
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.tables import (
    create_base,
    lance_core_env,
    lance_core_scan,
    lance_core_snapshots,
    open_base,
    rows,
    sorted_rows,
)

OPS = [
    ("put", range(5, 15), "g1"),  # updates 5..9, inserts 10..14
    ("delete", [0, 1, 12], None),  # deletes base rows and a gen-1 row
    ("put", [1, 3], "again"),  # re-inserts a deleted key, updates a base row
    ("put", [3, 3], "twice"),  # the later row within one write wins
    ("delete", [14], None),
    ("put", range(20, 26), "g3"),
]


def _apply(writer, ops):
    for op, ids, tag in ops:
        if op == "put":
            writer.put(rows(ids, tag))
        else:
            writer.delete(pa.table({"id": pa.array(list(ids), pa.int64())}))


def _expected(base_ids, ops):
    model = {i: f"base{i}" for i in base_ids}
    for op, ids, tag in ops:
        for i in ids:
            if op == "put":
                model[i] = f"{tag}{i}"
            else:
                model.pop(i, None)
    return model


def test_our_reader_matches_lance_core_on_lance_core_writes(location):
    """Lance core's ShardWriter writes several generations with updates and deletes."""
    create_base(location, ids=range(10))
    ds = open_base(location)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)
    region = str(uuid.uuid4())
    with open_base(location).mem_wal_writer(region, max_memtable_rows=12) as w:
        for op, ids, tag in OPS:
            if op == "put":
                w.put(rows(ids, tag))
            else:
                w.delete(pa.table({"id": pa.array(list(ids), pa.int64())}))
    ours = LsmReader(MemWalTable(location.uri, location.storage_options))
    assert len(ours.sources) > 3, "the scenario must span several generations"
    theirs = lance_core_scan(location)
    assert sorted_rows(ours.scan()) == sorted_rows(theirs)
    assert {r["id"]: r["name"] for r in sorted_rows(ours.scan())} == _expected(range(10), OPS)


def test_lance_core_reader_matches_ours_on_our_writes(location):
    """On S3, Lance core's point lookup drops storage options: only it runs inside lance_core_env."""
    create_base(location, ids=range(10))
    open_base(location).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(location.uri, region, storage_options=location.storage_options,
                      config=WriterConfig(max_memtable_rows=12, max_flush_interval_s=None)) as w:
        _apply(w, OPS)
    ours = LsmReader(MemWalTable(location.uri, location.storage_options))
    assert sorted_rows(ours.scan()) == sorted_rows(lance_core_scan(location))
    assert {r["id"]: r["name"] for r in sorted_rows(ours.scan())} == _expected(range(10), OPS)

    planner = LsmPointLookupPlanner(open_base(location), lance_core_snapshots(location), ["id"])
    for key in [0, 1, 3, 5, 9, 12, 14, 20, 99]:
        with lance_core_env(location):
            theirs = planner.plan_lookup(pa.array([key], pa.int64())).to_table()
        theirs = theirs.select(["id", "name", "score"]).to_pylist()
        mine = ours.get(key)
        assert (theirs[0] if theirs else None) == mine, f"point lookup of {key} differs from Lance core"


def test_filter_applies_to_newest_version_only(local_location):
    """
    base: id 1 score 0.5, id 2 score 1.0 | gen 1: id 1 score 100
    filter score <= 1 must NOT return id 1: its newest version does not match.
    """
    loc = local_location
    create_base(loc, ids=[1, 2])
    open_base(loc).initialize_mem_wal(unsharded=True)
    with RegionWriter(loc.uri, str(uuid.uuid4()), config=WriterConfig(max_flush_interval_s=None)) as w:
        w.put(pa.table({"id": [1], "name": ["hi"], "score": [100.0]}, schema=rows([]).schema))
    reader = LsmReader(loc.uri)
    assert reader.scan(filter="score <= 1").column("id").to_pylist() == [2], "stale base row must be hidden"
    assert reader.scan(filter=pc.field("score") > 50).column("id").to_pylist() == [1]
    assert LsmScanner.from_snapshots(open_base(loc), lance_core_snapshots(loc)).filter(
        "score <= 1").to_table().column("id").to_pylist() == [2]


def test_live_memtable_is_read_and_wins(local_location):
    loc = local_location
    create_base(loc, ids=[1])
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    w = RegionWriter(loc.uri, region, config=WriterConfig(max_flush_interval_s=None))
    w.put(rows([1, 2], "live"))
    w.delete(pa.table({"id": [2]}))
    reader = LsmReader(loc.uri, memtables=[(region, w.memtable.generation, w.memtable_table())])
    assert reader.get(1)["name"] == "live1", "the live MemTable must win over the base table"
    assert reader.get(2) is None, "a tombstone in the MemTable hides the key"
    assert LsmReader(loc.uri).get(1)["name"] == "base1", "without the MemTable the reader sees flushed state"


def test_missing_generation_directory_is_a_clear_error(local_location):
    import shutil

    loc = local_location
    create_base(loc, ids=[1])
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=WriterConfig(max_flush_interval_s=None)) as w:
        w.put(rows([5]))
    gen_dir = next(p for p in (loc.store().list_dirs(f"_mem_wal/{region}")) if "_gen_" in p)
    shutil.rmtree(f"{loc.uri}/_mem_wal/{region}/{gen_dir}")
    with pytest.raises(Exception, match=f"generation 1 of region {region}"):
        LsmReader(loc.uri)


def test_equality_filter_prunes_regions_without_changing_results(local_location):
    """bucket(id, 4): `id IN (3, 7)` can only live in the regions of bucket(3) and bucket(7)."""
    from memwal.table_writer import TableWriter

    loc = local_location
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(bucket_column="id", num_buckets=4)
    with TableWriter(loc.uri, config=WriterConfig(max_flush_interval_s=None)) as tw:
        tw.put(rows(range(0, 40), "w"))
    assert len(tw.writers) == 4
    reader = LsmReader(loc.uri)
    got = reader.scan(filter="id IN (3, 7)")
    assert sorted(got.column("id").to_pylist()) == [3, 7] and set(got.column("name").to_pylist()) == {"w3", "w7"}
    assert 1 <= len(reader.last_scan_regions) <= 2, "regions that cannot hold 3 or 7 are skipped"
    full = LsmReader(loc.uri)
    assert sorted_rows(full.scan(filter="id >= 0")) == sorted_rows(lance_core_scan(loc))
    assert full.last_scan_regions is None, "a range filter cannot prune"


def test_the_lance_core_oracle_does_not_read_through_our_region_manifest_code(local_location, monkeypatch):
    """lance_core_snapshots decodes the region manifests itself (generated protobuf, plain listing): with
    memwal.region_manifest's readers broken, Lance core's view is unchanged, so it can catch their bugs."""
    import memwal.region_manifest as rm

    loc = local_location
    create_base(loc, ids=range(5))
    open_base(loc).initialize_mem_wal(unsharded=True)
    with RegionWriter(loc.uri, str(uuid.uuid4()), config=WriterConfig(max_flush_interval_s=None)) as w:
        _apply(w, OPS[:2])
    expected = sorted_rows(lance_core_scan(loc))

    def broken(*args, **kwargs):
        raise AssertionError("the oracle must not use memwal.region_manifest")

    for name in ("list_regions", "load_latest_manifest", "load_manifest", "decode_manifest", "latest_version"):
        monkeypatch.setattr(rm, name, broken)
    assert sorted_rows(lance_core_scan(loc)) == expected
    assert {r["id"] for r in expected} == {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14}
