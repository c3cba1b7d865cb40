"""Crash injection: for every named fault point (memwal.faults.FAULT_POINTS) a child process runs a scenario
that reaches it and is SIGKILLed there (MEMWAL_FAULT). Then, in this process, the writer is restarted or
the job rerun, and we check against a model built from what the child acknowledged (it prints every
acknowledged operation, flushed, before going on):
- no acknowledged write is lost; a write whose WAL entry was durable when the child died is replayed;
- no row is applied twice (a rerun merge skips what was committed; the base table equals the model);
- merged_generations never decreases, over every retained table version;
- GC removed nothing still needed (the LSM view equals the model after the rerun and after a final GC);
- the next run is neither blocked nor confused: it completes and the table is right.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from memwal import naming
from memwal.catchup import catchup_table
from memwal.compaction import PENDING_CATCHUP, CompactionConfig, compact_table
from memwal.faults import FAULT_POINTS
from memwal.gc import STAGING_DIR, GcConfig, gc_table
from memwal.mem_wal_index import load_index, read_details_at
from memwal.merge import MergeConfig, merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.tables import SCHEMA, create_base, lance_core_scan, open_base, view

CHILD = Path(__file__).with_name("child.py")
NEVER = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)
BASE = {i: (f"base{i}", i / 2) for i in range(10)}  # tables.create_base

Model = dict[int, tuple[str, float]]


# -- helpers -------------------------------------------------------------------------------------------


def put(region: str, rows: list[tuple[int, str, float]]) -> dict:
    return {"op": "put", "region": region, "rows": [list(r) for r in rows]}


def delete(region: str, keys: list[int]) -> dict:
    return {"op": "delete", "region": region, "keys": keys}


def flush(region: str) -> dict:
    return {"op": "flush", "region": region}


def apply(model: Model, ops: list[dict]) -> Model:
    model = dict(model)
    for op in ops:
        if op["op"] == "put":
            for i, name, score in op["rows"]:
                model[i] = (name, score)
        elif op["op"] == "delete":
            for k in op["keys"]:
                model.pop(k, None)
    return model


def lsm(loc, memtables=()) -> Model:
    return view(LsmReader(MemWalTable(loc.uri, loc.storage_options), memtables=memtables).scan())


def new_table(loc, regions: int) -> list[str]:
    """Base ids 0..9, MemWAL initialised, a maintained scalar index; region ids in merge order (sorted)."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    return sorted(str(uuid.uuid4()) for _ in range(regions))


def write_generations(loc, region: str, model: Model, gens: list[list[dict]]) -> Model:
    """Each inner list of ops becomes one flushed generation, written in this process."""
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER) as w:
        for ops in gens:
            for op in ops:
                if op["op"] == "put":
                    ids, names, scores = zip(*op["rows"], strict=True)
                    w.put(pa.table({"id": ids, "name": names, "score": scores}, schema=SCHEMA))
                else:
                    w.delete(pa.table({"id": pa.array(op["keys"], pa.int64())}))
            w.flush()
            model = apply(model, ops)
    return model


def three_generations(loc, regions: list[str]) -> Model:
    """Region r: keys 100(r+1)..: inserts, an update, a delete of a base row and of its own row."""
    model = dict(BASE)
    for r, region in enumerate(regions):
        k = 100 * (r + 1)
        model = write_generations(loc, region, model, [
            [put(region, [(k, "g1", 1.0), (k + 1, "g1", 1.0)]), delete(region, [r])],
            [put(region, [(k + 1, "g2", 2.0), (k + 2, "g2", 2.0)]), delete(region, [k])],
            [put(region, [(k, "g3", 3.0), (k + 2, "g3a", 3.0), (k + 2, "g3b", 3.5)])],
        ])
    return model


def run_child(loc, spec: dict, fault: str, skip: int = 0) -> list[dict]:
    """Run child.py with MEMWAL_FAULT=fault; it must die by SIGKILL. Returns its JSON records."""
    spec = {"uri": loc.uri, "storage_options": loc.storage_options, **spec}
    env = dict(os.environ, MEMWAL_FAULT=fault, MEMWAL_FAULT_SKIP=str(skip))
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(spec)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == -9, (
        f"child for {fault} (skip {skip}) exited {proc.returncode}, not by SIGKILL:\n"
        f"{proc.stdout}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def acked(records: list[dict]) -> list[dict]:
    return [r["ack"] for r in records if "ack" in r]


def merged_history(loc) -> dict[str, list[int]]:
    """merged_generations per region over every retained table version; asserts it never decreases."""
    store = loc.store()
    history: dict[str, list[int]] = {}
    for v in sorted(int(x["version"]) for x in open_base(loc).versions()):
        details = read_details_at(store, v)
        if details is None:
            continue
        for region in set(history) | set(details.merged_generations):
            history.setdefault(region, []).append(details.merged_generation(region))
    for region, gens in history.items():
        assert gens == sorted(gens), f"merged_generations[{region}] decreased across table versions: {gens}"
    return history


def gen_dirs(loc, region: str) -> list[str]:
    return sorted(d for d in loc.store().list_dirs(naming.region_dir(region)) if "_gen_" in d)


def final_check(loc, model: Model) -> None:
    """Recover every region, merge all, compare with the model; a full GC must not change the view."""
    store = loc.store()
    for region in list_regions(store):
        RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER).close()
    assert lsm(loc) == model, "LSM view after recovery differs from the model"
    assert view(lance_core_scan(loc)) == model, "Lance core's LSM view differs from the model"
    summary = merge_table(MemWalTable(loc.uri, loc.storage_options))
    assert not summary.failed_regions, [r.error for r in summary.regions]
    assert view(open_base(loc).to_table()) == model, "merged base table differs from the model"
    merged_history(loc)
    merged = load_index(loc.uri, loc.storage_options).merged_generations
    for region in list_regions(store):
        assert merged.get(region, 0) == load_latest_manifest(store, region).current_generation - 1
    catchup_table(MemWalTable(loc.uri, loc.storage_options))
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    gc_table(MemWalTable(loc.uri, loc.storage_options), config=GcConfig(grace_period_s=0, keep_manifest_versions=1))
    assert lsm(loc) == model, "a final GC changed the LSM view"
    for region in list_regions(store):
        assert gen_dirs(loc, region) == [], f"GC left generation directories in {region}"
    assert store.list(STAGING_DIR) == [], "GC left merge staging files behind"


# -- scenarios, one or more per fault point ------------------------------------------------------------


def crash_in_put(loc) -> None:
    """Killed on the 5th WAL write (a put that is durable but was never acknowledged)."""
    (r,) = new_table(loc, 1)
    ops = [put(r, [(10, "a", 1.0), (11, "a", 1.0)]), put(r, [(12, "a", 1.0)]), delete(r, [10, 1]), flush(r),
           put(r, [(13, "a", 1.0)]), put(r, [(11, "b", 2.0)]), delete(r, [12]), put(r, [(14, "a", 1.0)])]
    done = acked(run_child(loc, {"scenario": "write", "ops": ops}, "writer.after_wal_write", skip=4))
    assert done == ops[:5], "the child acknowledged more or less than the writes before the fault"
    expected = apply(BASE, ops[:6])  # the in-flight put's WAL entry is durable: replay must include it
    w = RegionWriter(loc.uri, r, config=NEVER)
    assert w.stats.replayed_entries == 2
    assert lsm(loc, [(r, w.memtable.generation, w.memtable_table())]) == expected
    w.put(pa.table({"id": [15], "name": ["after"], "score": [9.0]}, schema=SCHEMA))
    w.close()
    final_check(loc, apply(expected, [put(r, [(15, "after", 9.0)])]))


def crash_after_generation_write(loc) -> None:
    """Killed after writing generation 2's directory, before the manifest commit: a failed-flush leftover."""
    (r,) = new_table(loc, 1)
    ops = [put(r, [(10, "a", 1.0)]), flush(r), put(r, [(10, "b", 2.0), (11, "b", 2.0)]), delete(r, [2]),
           flush(r), put(r, [(12, "never", 0.0)])]
    done = acked(run_child(loc, {"scenario": "write", "ops": ops}, "writer.after_generation_write", skip=1))
    assert done == ops[:4]
    model = apply(BASE, done)
    store = loc.store()
    assert [g.generation for g in load_latest_manifest(store, r).flushed_generations] == [1]
    assert len(gen_dirs(loc, r)) == 2, "generation 1 and the unlisted leftover of generation 2"
    w = RegionWriter(loc.uri, r, config=NEVER)
    assert w.stats.replayed_entries == 2 and w.memtable.generation == 2
    w.close()
    assert [g.generation for g in load_latest_manifest(store, r).flushed_generations] == [1, 2]
    assert lsm(loc) == model
    merge_table(loc.uri)
    catchup_table(loc.uri)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    summary = gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    assert [a.kind for a in summary.actions].count("failed_flush") == 1, "the leftover must be collected"
    final_check(loc, model)


def crash_after_manifest_commit(loc) -> None:
    """Killed after the flush committed, before the MemTable rotated: nothing may be replayed twice."""
    (r,) = new_table(loc, 1)
    ops = [put(r, [(10, "a", 1.0), (11, "a", 1.0)]), delete(r, [11, 3]), flush(r), put(r, [(12, "never", 0.0)])]
    done = acked(run_child(loc, {"scenario": "write", "ops": ops}, "writer.after_manifest_commit"))
    assert done == ops[:2]
    model = apply(BASE, done)
    w = RegionWriter(loc.uri, r, config=NEVER)
    assert w.stats.replayed_entries == 0 and w.memtable.generation == 2, "flushed entries must not be replayed"
    assert lsm(loc, [(r, w.memtable.generation, w.memtable_table())]) == model
    w.put(pa.table({"id": [11], "name": ["again"], "score": [5.0]}, schema=SCHEMA))
    w.close()
    assert [g.generation for g in load_latest_manifest(loc.store(), r).flushed_generations] == [1, 2]
    final_check(loc, apply(model, [put(r, [(11, "again", 5.0)])]))


def _merge_crash(loc, fault: str, spark: bool = False, apply: str = "auto") -> None:
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    # the first commit passes, the second dies; on Spark one job deduplicated and staged the whole round first.
    # A byte budget below one generation: one generation of one region per commit (region 0's 1, then its 2)
    run_child(loc, {"scenario": "merge", "spark": spark, "apply": apply, "parallelism": 2, "bytes_per_commit": 1},
              fault, skip=1)
    if spark:
        assert loc.store().list(STAGING_DIR), "the dead driver's staged upserts are left behind"
    expected_first = 2 if fault == "merge.after_commit" else 1
    merged = load_index(loc.uri).merged_generations
    assert merged.get(regions[0], 0) == expected_first and merged.get(regions[1], 0) == 0, merged
    if fault in ("merge.between_passes", "merge.between_update_and_marker"):
        assert 100 not in view(open_base(loc).to_table()), "the deletes of generation 2 were committed"
    if fault == "merge.between_update_and_marker":
        assert view(open_base(loc).to_table())[101] == ("g2", 2.0), "generation 2's Update was committed"
    merged_history(loc)
    assert lsm(loc) == model, "a half-finished merge changed the LSM view"
    assert view(lance_core_scan(loc)) == model
    rerun = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1, apply=apply))
    assert not rerun.failed_regions
    got = {r.region_id: r.generations for r in rerun.regions}
    assert got == {regions[0]: list(range(expected_first + 1, 4)), regions[1]: [1, 2, 3]}, (
        "the rerun must merge exactly what was not committed (nothing twice)")
    assert view(open_base(loc).to_table()) == model
    final_check(loc, model)


def crash_before_merge_commit(loc) -> None:
    _merge_crash(loc, "merge.before_commit")


def crash_between_merge_passes(loc) -> None:
    """Killed after the delete pass of region 0's generation 2 (deletes key 100), before its upsert pass."""
    _merge_crash(loc, "merge.between_passes")


def crash_after_merge_commit(loc) -> None:
    _merge_crash(loc, "merge.after_commit")


def crash_between_apply_and_update(loc) -> None:
    """Fragment apply: the tasks of region 0's generation 2 wrote deletion vectors and fragments, killed
    before the Update: nothing of it is visible, the rerun applies generation 2 once."""
    _merge_crash(loc, "merge.apply_before_commit", apply="fragments")


def crash_between_update_and_marker(loc) -> None:
    """Fragment apply: generation 2's Update committed (100 deleted, 101 replaced), killed before the
    marker commit: the view is exact, the rerun replaces 101 again and moves the marker once."""
    _merge_crash(loc, "merge.between_update_and_marker", apply="fragments")


def _crash_between_marker_steps(loc, apply: str) -> None:
    """Both regions' generations 1..3 in one commit (the generation count is per region batch): its data and
    first marker step (generation 1 of each region) committed, killed before the marker-only step to 2:
    merged_generations says 1 while the base already holds the newest rows of 1..3, which generations 2 and
    3 still shadow: the view is exact; the rerun merges 2 and 3 of each region (the same rows again)."""
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    run_child(loc, {"scenario": "merge", "apply": apply, "parallelism": 2, "generations_per_commit": 3},
              "merge.between_marker_steps")
    merged = load_index(loc.uri).merged_generations
    assert merged.get(regions[0], 0) == 1 and merged.get(regions[1], 0) == 1, merged
    assert view(open_base(loc).to_table())[102] == ("g3b", 3.5), "the data of generations 1..3 was committed"
    assert view(open_base(loc).to_table())[202] == ("g3b", 3.5), "region 1's too, in the same commit"
    merged_history(loc)
    assert lsm(loc) == model, "a merge stopped between its marker steps changed the LSM view"
    assert view(lance_core_scan(loc)) == model
    rerun = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1, apply=apply))
    assert not rerun.failed_regions
    got = {r.region_id: r.generations for r in rerun.regions}
    assert got == {regions[0]: [2, 3], regions[1]: [2, 3]}, "the rerun merges exactly what is not marked"
    assert view(open_base(loc).to_table()) == model
    final_check(loc, model)


def crash_between_marker_steps(loc) -> None:
    _crash_between_marker_steps(loc, "passes")


def crash_between_marker_steps_fragments(loc) -> None:
    _crash_between_marker_steps(loc, "fragments")


def crash_between_apply_and_update_spark(loc) -> None:
    """Fragment apply of upserts staged by the Spark dedup (the scan path: the tasks read the staged files
    and write scratch files of the keys they found), killed before the Update: nothing visible, the rerun
    applies generation 2 once; what the dead driver staged goes with GC."""
    _merge_crash(loc, "merge.apply_before_commit", spark=True, apply="fragments")


def crash_before_merge_commit_fragments(loc) -> None:
    _merge_crash(loc, "merge.before_commit", apply="fragments")


def crash_after_merge_commit_fragments(loc) -> None:
    _merge_crash(loc, "merge.after_commit", apply="fragments")


def crash_before_merge_commit_spark(loc) -> None:
    _merge_crash(loc, "merge.before_commit", spark=True)


def crash_after_merge_commit_spark(loc) -> None:
    _merge_crash(loc, "merge.after_commit", spark=True)


def crash_after_snapshot_details_commit(loc) -> None:
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    merge_table(loc.uri, regions=[regions[0]])
    before = load_index(loc.uri).details
    run_child(loc, {"scenario": "snapshot"}, "details.after_commit")
    after = load_index(loc.uri).details
    assert after.num_regions == 2, "the details commit happened before the fault"
    assert dict(after.merged_generations) == dict(before.merged_generations)
    assert read_snapshot(loc.uri).num_rows == 2
    assert refresh_snapshot(loc.uri).num_regions == 2, "a rerun must complete"
    final_check(loc, model)


def crash_after_catchup_details_commit(loc) -> None:
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    merge_table(loc.uri)
    run_child(loc, {"scenario": "catchup"}, "details.after_commit")
    details = load_index(loc.uri).details
    assert details.index_catchup["name_idx"] == {r: 3 for r in regions}
    assert dict(details.merged_generations) == {r: 3 for r in regions}
    rerun = catchup_table(loc.uri)
    assert all(i.covered and not i.error for i in rerun.indexes)
    final_check(loc, model)


def _index_build_crash(loc, fault: str) -> None:
    """Merged generations in several fragments the index does not cover; the child builds the index's
    segments as tasks over two fragment groups and dies before or right after their commit."""
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1))
    before = open_base(loc)
    segments_before = {str(s.uuid) for d in before.describe_indices() if d.name == "name_idx" for s in d.segments}
    catchup_before = dict(load_index(loc.uri).details.index_catchup)
    run_child(loc, {"scenario": "catchup_tasks"}, fault)
    after = open_base(loc)
    assert view(after.to_table()) == model and lsm(loc) == model, "the table stays readable and unchanged"
    segments = {str(s.uuid) for d in after.describe_indices() if d.name == "name_idx" for s in d.segments}
    on_disk = {m.path.split("/")[1] for m in loc.store().list("_indices")}
    referenced = {str(s.uuid) for d in after.describe_indices() for s in d.segments}
    if fault == "index_build.after_tasks":
        assert dict(load_index(loc.uri).details.index_catchup) == catchup_before, "nothing recorded"
        assert segments == segments_before, "the index is as it was"
        orphans = on_disk - referenced
        assert len(orphans) == 2, "the two built segments: written, referenced by no version"
        # retention's cleanup of unreferenced files (its --delete-unverified) takes them
        after.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
        assert not orphans & {m.path.split("/")[1] for m in loc.store().list("_indices")}
    else:
        assert len(segments - segments_before) == 2 and segments_before <= segments, "two segments joined it"
        assert not on_disk - referenced
        # not recorded, but the index covers every fragment: readers take it as caught up (index_coverage)
        assert load_index(loc.uri).details.index_catchup["name_idx"] == {r: 3 for r in regions}
    rerun = catchup_table(loc.uri)
    assert all(i.covered and not i.error for i in rerun.indexes), rerun
    assert load_index(loc.uri).details.index_catchup["name_idx"] == {r: 3 for r in regions}
    assert view(open_base(loc).to_table(filter="name = 'g3'")) == {k: v for k, v in model.items() if v[0] == "g3"}
    final_check(loc, model)


def crash_after_index_build_tasks(loc) -> None:
    _index_build_crash(loc, "index_build.after_tasks")


def crash_after_index_build_commit(loc) -> None:
    _index_build_crash(loc, "index_build.after_commit")


def _gc_crash(loc, fault: str) -> None:
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    merge_table(loc.uri)
    catchup_table(loc.uri)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    run_child(loc, {"scenario": "gc"}, fault)
    assert lsm(loc) == model, "a half-finished GC changed the LSM view"
    assert view(lance_core_scan(loc)) == model
    if fault == "gc.after_manifest_prune":
        assert load_latest_manifest(loc.store(), regions[0]).flushed_generations == ()
        assert len(gen_dirs(loc, regions[0])) == 3, "the prune was committed, nothing deleted yet"
    summary = gc_table(loc.uri, config=GcConfig(grace_period_s=0, keep_manifest_versions=1))
    assert not [r for r in summary.regions if r.error]
    for region in regions:
        assert gen_dirs(loc, region) == [], "the rerun must finish what the crashed GC started"
    assert lsm(loc) == model
    again = gc_table(loc.uri, config=GcConfig(grace_period_s=0, keep_manifest_versions=1))
    assert [a for a in again.actions if a.kind != "manifest"] == [], "a third run has nothing left to do"
    final_check(loc, model)


def crash_after_gc_prune(loc) -> None:
    _gc_crash(loc, "gc.after_manifest_prune")


def crash_mid_gc_delete(loc) -> None:
    _gc_crash(loc, "gc.mid_delete")


def crash_after_external_snapshot_write(loc) -> None:
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    before = load_index(loc.uri)
    run_child(loc, {"scenario": "snapshot", "inline_threshold": 0}, "snapshot.after_external_write")
    after = load_index(loc.uri)
    assert after.table_version == before.table_version, "nothing was committed"
    assert after.details.snapshot_ts_millis == 0 and after.details.num_regions == before.details.num_regions
    orphans = [m.path for m in loc.store().list("_indices") if m.path.endswith("/index.lance")]
    assert len(orphans) == 1, "the uncommitted index.lance is left behind (nothing collects it)"
    summary = refresh_snapshot(loc.uri, inline_threshold=0)
    assert summary.storage == "external" and read_snapshot(loc.uri).num_rows == 2
    final_check(loc, model)


def _compaction_crash(loc, fault: str) -> None:
    """Three generations per region merged one commit each (several fragments) and caught up; the child
    compacts them into one fragment and dies before or right after Lance's commit."""
    regions = new_table(loc, 2)
    model = three_generations(loc, regions)
    merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1))
    catchup_table(loc.uri)
    before = load_index(loc.uri).details
    fragments = len(open_base(loc).get_fragments())
    run_child(loc, {"scenario": "compaction"}, fault)
    after = load_index(loc.uri).details
    assert dict(after.merged_generations) == dict(before.merged_generations), "compaction must keep progress"
    assert lsm(loc) == model, "a crashed compaction changed the LSM view"
    assert view(open_base(loc).to_table()) == model, "a crashed compaction changed the base table"
    if fault == "compaction.before_commit":
        assert len(open_base(loc).get_fragments()) == fragments, "nothing was committed"
        assert after.index_catchup == before.index_catchup
    else:
        assert len(open_base(loc).get_fragments()) == 1, "the compaction was committed"
        # Lance's index remap dropped index_catchup and the crash came before compaction restored it: the
        # entries were recorded before the commit, and the next compaction run (not due) puts them back;
        # the next catch-up would too (the index covers every fragment).
        assert after.index_catchup == {} and loc.store().exists(PENDING_CATCHUP)
        assert compact_table(loc.uri, config=CompactionConfig()).due == []
        assert load_index(loc.uri).details.index_catchup == before.index_catchup
        assert not loc.store().exists(PENDING_CATCHUP)
        assert catchup_table(loc.uri).indexes[0].covered
        assert load_index(loc.uri).details.index_catchup == before.index_catchup
    rerun = compact_table(loc.uri, config=CompactionConfig(force=True, target_rows_per_fragment=1000))
    assert rerun.error is None and rerun.health_after["fragments"] == 1
    assert view(open_base(loc).to_table()) == model
    final_check(loc, model)


def crash_before_compaction_commit(loc) -> None:
    _compaction_crash(loc, "compaction.before_commit")


def crash_after_compaction_commit(loc) -> None:
    _compaction_crash(loc, "compaction.after_commit")


SCENARIOS: dict[str, list[Callable]] = {
    "writer.after_wal_write": [crash_in_put],
    "writer.after_generation_write": [crash_after_generation_write],
    "writer.after_manifest_commit": [crash_after_manifest_commit],
    "merge.before_commit": [crash_before_merge_commit, crash_before_merge_commit_spark,
                            crash_before_merge_commit_fragments],
    "merge.between_passes": [crash_between_merge_passes],
    "merge.apply_before_commit": [crash_between_apply_and_update, crash_between_apply_and_update_spark],
    "merge.between_update_and_marker": [crash_between_update_and_marker],
    "merge.between_marker_steps": [crash_between_marker_steps, crash_between_marker_steps_fragments],
    "merge.after_commit": [crash_after_merge_commit, crash_after_merge_commit_spark,
                           crash_after_merge_commit_fragments],
    "details.after_commit": [crash_after_snapshot_details_commit, crash_after_catchup_details_commit],
    "gc.after_manifest_prune": [crash_after_gc_prune],
    "gc.mid_delete": [crash_mid_gc_delete],
    "snapshot.after_external_write": [crash_after_external_snapshot_write],
    "compaction.before_commit": [crash_before_compaction_commit],
    "compaction.after_commit": [crash_after_compaction_commit],
    "index_build.after_tasks": [crash_after_index_build_tasks],
    "index_build.after_commit": [crash_after_index_build_commit],
}
CASES = [(point, fn) for point in FAULT_POINTS for fn in SCENARIOS.get(point, [None])]


@pytest.fixture(scope="module")
def exercised(request):
    points: dict[str, int] = {}
    yield points
    line = (f"[memwal crash] {len(points)}/{len(FAULT_POINTS)} fault points exercised by "
            f"{sum(points.values())} SIGKILLed child processes")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + line)


def test_every_fault_point_has_a_scenario():
    assert sorted(set(SCENARIOS) - set(FAULT_POINTS)) == [], "scenario for a fault point that no longer exists"
    assert [p for p in FAULT_POINTS if p not in SCENARIOS] == [], "new fault point without a crash scenario"


@pytest.mark.parametrize(("point", "scenario"), CASES,
                         ids=[f"{p}-{fn.__name__ if fn else 'missing'}" for p, fn in CASES])
def test_crash_at_fault_point(point, scenario, local_location, exercised, record_property):
    if scenario is None:
        pytest.fail(f"no crash scenario for fault point {point}")
    scenario(local_location)
    exercised[point] = exercised.get(point, 0) + 1
    record_property("fault_point", point)
