"""Our jobs on a table that Lance core's ShardWriter wrote, and Lance core carrying on after them."""

import uuid
from datetime import timedelta

import pyarrow as pa
from lance.mem_wal import LsmScanner

from memwal.catchup import catchup_table
from memwal.gc import GcConfig, gc_table
from memwal.mem_wal_index import load_index
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import load_latest_manifest
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.table import MemWalTable

from support.tables import create_base, lance_core_scan, lance_core_snapshots, open_base, rows, sorted_rows


def _lance_core_writes(loc, region, start):
    with open_base(loc).mem_wal_writer(region, max_memtable_rows=8) as w:
        w.put(rows(range(start, start + 8), f"c{start}-"))
        w.delete(pa.table({"id": pa.array([start, 1], pa.int64())}))
        w.put(rows(range(start + 4, start + 12), f"d{start}-"))


def test_full_pipeline_on_lance_core_written_table_and_lance_core_resumes(location):
    loc = location
    create_base(loc, ids=range(6))
    open_base(loc).initialize_mem_wal(bucket_column="id", num_buckets=2)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    regions = [str(uuid.uuid4()), str(uuid.uuid4())]
    _lance_core_writes(loc, regions[0], 100)
    _lance_core_writes(loc, regions[1], 200)
    before = sorted_rows(lance_core_scan(loc))
    assert sorted_rows(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan()) == before

    summary = merge_table(MemWalTable(loc.uri, loc.storage_options))
    assert not summary.failed_regions and summary.commits >= 2
    assert sorted_rows(open_base(loc).to_table()) == before, "merged base table equals the LSM view"
    assert open_base(loc)._ds.index_statistics("__lance_mem_wal")  # Lance core still reads its index
    catchup_table(MemWalTable(loc.uri, loc.storage_options))
    refresh_snapshot(MemWalTable(loc.uri, loc.storage_options))
    assert read_snapshot(MemWalTable(loc.uri, loc.storage_options)).num_rows == 2
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    gc = gc_table(MemWalTable(loc.uri, loc.storage_options), config=GcConfig(keep_manifest_versions=2))
    assert gc.to_dict()["deleted"].get("generation", 0) >= 2
    manifest = load_latest_manifest(loc.store(), regions[0])
    assert manifest.flushed_generations == ()

    # Lance core takes the region over again after our GC rewrote its manifest, and writes on.
    _lance_core_writes(loc, regions[0], 300)
    theirs = LsmScanner.from_snapshots(open_base(loc), lance_core_snapshots(loc)).to_table()
    ours = LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan()
    assert sorted_rows(ours) == sorted_rows(theirs)
    assert load_latest_manifest(loc.store(), regions[0]).writer_epoch == 2
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    assert sorted_rows(open_base(loc).to_table()) == sorted_rows(theirs)
    merged = load_index(loc.uri, loc.storage_options).merged_generations
    assert merged[regions[0]] > merged[regions[1]], "the new generations were merged after the old ones"
