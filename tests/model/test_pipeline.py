"""One full pipeline, end to end, on S3 (moto) and locally: writers on two regions (updates, deletes,
a crash and a recovery), partial and full merge, index catch-up, snapshot refresh (inline and external),
Lance cleanup and GC; after every stage our LSM view, Lance core's and (once merged) the base table are
checked against a plain model of the acknowledged writes."""

from __future__ import annotations

import uuid
from datetime import timedelta

import lance
import pyarrow as pa

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

from support.maintenance import merge_region
from support.tables import SCHEMA, create_base, lance_core_scan, open_base

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


def test_vector_and_fts_table_maintained_by_the_jobs_against_the_model(local_location):
    """A table with IVF_PQ, FTS and BTREE indexes through 8 cycles of writes (upserts, new keys, deletes)
    and the maintenance DAG's jobs in its order (merge -> catch-up with the default IndexPolicy -> compaction
    when due -> retention -> snapshot -> GC). After every job, through Lance: exact and ANN vector search,
    FTS and scalar filters equal the brute-force model (tests/support/vector_model.py), and no index has more
    segments than the bound. Each catch-up adds a vector segment, so without folding the index would reach
    9 segments and compaction could not combine the fragments: certain here, so asserted."""
    from vector_machine import FTS_INDEX, VECTOR_INDEX, create_vector_indexes, vector_table

    from memwal.compaction import compact_table
    from memwal.index_segments import segment_counts
    from memwal.maintenance_config import DEFAULT_MAX_INDEX_SEGMENTS, CompactionConfig, RetentionConfig
    from memwal.retention import retain_versions

    from support.vector_model import check_lance_searches

    loc, so = local_location, local_location.storage_options
    model: Model = {k: (f"base.{k}", float(-1 - k)) for k in range(16)}
    ds = lance.write_dataset(vector_table(sorted(model.items())), loc.uri)
    ds.create_scalar_index("name", "BTREE", name="name_idx")
    create_vector_indexes(ds)
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    table = MemWalTable(loc.uri, so)
    folded, compacted = 0, 0

    def check(stage: str) -> None:
        base = open_base(loc)
        assert _view(base.to_table()) == model, f"{stage}: base table differs from the model"
        check_lance_searches(base, {k: v[0] for k, v in model.items()}, {k: v[1] for k, v in model.items()},
                             VECTOR_INDEX, FTS_INDEX, stage)
        segments = segment_counts(base)
        assert max(segments.values()) <= DEFAULT_MAX_INDEX_SEGMENTS, f"{stage}: {segments}"

    for c in range(1, 9):
        vals = [(k, (f"c{c}.{k}", float(c * 100 + k))) for k in [c, c + 5, 20 + c, 21 + c]]
        gone = [c + 2]
        with RegionWriter(loc.uri, region, storage_options=so,
                          config=WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)) as w:
            w.put(vector_table(vals))
            w.delete(pa.table({"id": pa.array(gone, pa.int64())}))
        model.update(vals)
        for k in gone:
            model.pop(k, None)
        assert not merge_table(table).failed_regions
        check(f"cycle {c}: merge")
        catch = catchup_table(table)
        assert all(i.error is None and i.covered for i in catch.indexes), catch.to_dict()
        folded += sum(i.folded_segments for i in catch.indexes)
        check(f"cycle {c}: catch-up")
        summary = compact_table(table, CompactionConfig(max_small_fragments=2, max_deleted_ratio=0.1))
        assert summary.error is None, summary.to_dict()
        compacted += summary.tasks_committed
        check(f"cycle {c}: compaction")
        retain_versions(table, RetentionConfig(older_than_s=0, keep_versions=2))
        refresh_snapshot(table)
        assert not [r for r in gc_table(table, config=GcConfig(grace_period_s=0)).regions if r.error]
        check(f"cycle {c}: retention, snapshot, GC")
    assert folded > 0, "catch-up never folded the vector index's segments"
    assert compacted > 0, "compaction never combined fragments"
    stats = {n: open_base(loc).stats.index_stats(n) for n in (VECTOR_INDEX, FTS_INDEX, "name_idx")}
    assert all(s["num_unindexed_rows"] == 0 for s in stats.values()), stats
    assert len(open_base(loc).get_fragments()) <= 2, "compaction keeps the fragments few"
