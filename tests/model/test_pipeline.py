"""One full pipeline, end to end, on S3 (moto) and locally: writers on two regions (updates, deletes,
a crash and a recovery), partial and full merge, index catch-up, snapshot refresh (inline and external),
Lance cleanup and GC; after every stage our LSM view, Lance core's and (once merged) the base table are
checked against a plain model of the acknowledged writes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pyarrow as pa
from maintenance import merge_region
from tables import SCHEMA, create_base, lance_core_scan, open_base

from memwal import naming
from memwal.catchup import catchup_table
from memwal.gc import GcConfig, gc_table
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig, merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import load_latest_manifest
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.status import table_status
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

Model = dict[int, tuple[str, float]]


def _view(table: pa.Table) -> Model:
    out: Model = {}
    for r in table.select(["id", "name", "score"]).to_pylist():
        assert r["id"] not in out, f"key {r['id']} twice"
        out[r["id"]] = (r["name"], r["score"])
    return out


def test_full_pipeline_against_the_model(location):
    loc, so = location, location.storage_options
    create_base(loc, ids=range(6))
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    open_base(loc).initialize_mem_wal(unsharded=True)
    model: Model = {i: (f"base{i}", i / 2) for i in range(6)}
    regions = sorted(str(uuid.uuid4()) for _ in range(2))
    config = WriterConfig(max_memtable_rows=4, max_memtable_bytes=10**12, max_flush_interval_s=None)
    writers = {r: RegionWriter(loc.uri, r, storage_options=so, config=config) for r in regions}
    n = 0

    def put(keys: list[int]) -> None:
        nonlocal n
        for ri, region in enumerate(regions):
            mine = [k for k in keys if k % 2 == ri]
            if mine:
                n += 1
                writers[region].put(pa.table({"id": mine, "name": [f"p{n}.{k}" for k in mine],
                                              "score": [float(n)] * len(mine)}, schema=SCHEMA))
                model.update({k: (f"p{n}.{k}", float(n)) for k in mine})

    def delete(keys: list[int]) -> None:
        for ri, region in enumerate(regions):
            mine = [k for k in keys if k % 2 == ri]
            if mine:
                writers[region].delete(pa.table({"id": pa.array(mine, pa.int64())}))
                for k in mine:
                    model.pop(k, None)

    def check(stage: str, merged_fully: bool = False) -> None:
        memtables = [(r, w.memtable.generation, w.memtable_table()) for r, w in writers.items() if w is not None]
        assert _view(LsmReader(MemWalTable(loc.uri, so), memtables=memtables).scan()) == model, stage
        flushed = _view(LsmReader(MemWalTable(loc.uri, so)).scan())
        assert _view(lance_core_scan(loc)) == flushed, f"{stage}: Lance core differs"
        if merged_fully:
            assert _view(open_base(loc).to_table()) == model, f"{stage}: base table differs"

    for round_ in range(3):
        put([10 + round_, 11 + round_, 1, 2])
        put([1, 12, 13, 1])
        delete([0, 11, 3])
        put([3, 20 + round_])
    check("written")
    crashed = regions[0]
    writers[crashed] = None  # crash: its MemTable is lost, its WAL is durable; a new writer replays it
    writers[crashed] = RegionWriter(loc.uri, crashed, storage_options=so, config=config)
    assert writers[crashed].stats.replayed_entries > 0
    check("recovered")
    for w in writers.values():
        w.flush()

    merge_region(loc.uri, so, regions[0], MergeConfig(max_generations_per_commit=1), up_to_generation=2)
    assert load_index(loc.uri, so).merged_generations[regions[0]] == 2
    check("partial merge")
    refresh_snapshot(MemWalTable(loc.uri, so), inline_threshold=0)
    snap = read_snapshot(MemWalTable(loc.uri, so))
    assert snap is not None and snap.num_rows == 2
    summary = merge_table(MemWalTable(loc.uri, so), config=MergeConfig(max_generations_per_commit=2))
    assert not summary.failed_regions
    check("full merge", merged_fully=True)
    catch = catchup_table(MemWalTable(loc.uri, so))
    assert [i.covered for i in catch.indexes] == [True]
    details = load_index(loc.uri, so).details
    assert details.index_catchup["name_idx"] == dict(details.merged_generations)
    refresh_snapshot(MemWalTable(loc.uri, so))
    snap = read_snapshot(MemWalTable(loc.uri, so))
    rows = {str(uuid.UUID(bytes=r["region_id"])): r for r in snap.to_pylist()}
    for region in regions:
        m = load_latest_manifest(loc.store(), region)
        assert rows[region]["current_generation"] == m.current_generation

    put([30, 31])
    delete([1])
    check("more writes")
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    gc = gc_table(MemWalTable(loc.uri, so), config=GcConfig(grace_period_s=0, keep_manifest_versions=2))
    assert not [r for r in gc.regions if r.error]
    assert sum(a.kind == "generation" for a in gc.actions) > 0, "GC must collect merged, caught-up generations"
    check("after GC")
    for region in regions:
        kept = {fg.generation for fg in load_latest_manifest(loc.store(), region).flushed_generations}
        merged = load_index(loc.uri, so).merged_generations[region]
        assert all(g > merged for g in kept), "merged and caught-up generations are collected"
        dirs = [d for d in loc.store().list_dirs(naming.region_dir(region)) if "_gen_" in d]
        assert len(dirs) == len(kept)
    for w in writers.values():
        w.close()
    writers = {r: None for r in regions}
    assert not merge_table(MemWalTable(loc.uri, so)).failed_regions
    check("closed and merged", merged_fully=True)
    status = table_status(MemWalTable(loc.uri, so))
    assert all(r.unmerged_generations == 0 and r.error is None for r in status.regions)
