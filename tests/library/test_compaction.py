"""Compaction (memwal.compaction): when it is due, what it keeps intact (MemWAL index, snapshot, indexes,
catch-up, the LSM view), and both orders of a race with a merge, forced deterministically."""

from __future__ import annotations

import argparse
import pickle
import uuid
from dataclasses import replace

import lance
import pyarrow as pa
import pytest

from memwal.airflow.config import parse_tables
from memwal.catchup import catchup_table
from memwal.compaction import (
    CompactionConfig,
    compact_table,
    due_reasons,
    execute_in_process,
    fragment_health,
)
from memwal.jobs import add_job_arguments, job_options
from memwal.mem_wal_index import load_index
from memwal.merge import MergeInput, local_dedup, merge_table
from memwal.reader import LsmReader
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.storage import lance_storage_options
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.tables import indexes_covering_every_fragment, open_base, rows, view

ONE_GEN_PER_FLUSH = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)
PAIRS = CompactionConfig(force=True, target_rows_per_fragment=20, use_lock=False)


def fragmented_table(loc, base_rows: int = 40, rows_per_fragment: int = 10) -> str:
    """Base ids 0..base_rows-1 in fragments of rows_per_fragment rows, MemWAL initialised, a BTREE on
    name; one region id returned (nothing written yet)."""
    lance.write_dataset(rows(range(base_rows), "base"), loc.uri, max_rows_per_file=rows_per_fragment,
                        storage_options=lance_storage_options(loc.storage_options))
    open_base(loc).initialize_mem_wal(unsharded=True)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    return str(uuid.uuid4())


def write(loc, region: str, generations: list[tuple[list[int], list[int]]], tag: str = "w") -> None:
    """One flushed generation per (upserted ids, deleted ids)."""
    with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
        for g, (ups, dels) in enumerate(generations):
            if ups:
                w.put(rows(ups, f"{tag}{g}-"))
            if dels:
                w.delete(pa.table({"id": pa.array(dels, pa.int64())}))
            w.flush()


def lsm(loc) -> dict:
    return view(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan())


def base(loc) -> dict:
    return view(open_base(loc).to_table())


def test_due_rules():
    cfg = CompactionConfig(max_fragments=4, max_small_fragments=3, max_deleted_ratio=0.2,
                           target_rows_per_fragment=100)
    from memwal.compaction import FragmentHealth

    assert due_reasons(FragmentHealth(fragments=2, small_fragments=2, physical_rows=200), cfg) == []
    assert due_reasons(FragmentHealth(fragments=5, small_fragments=0, physical_rows=500), cfg) == [
        "5 fragments > 4"]
    assert due_reasons(FragmentHealth(fragments=3, small_fragments=3, physical_rows=30), cfg) == [
        "3 small fragments >= 3"]
    assert due_reasons(FragmentHealth(fragments=1, physical_rows=100, deleted_rows=20), cfg) == [
        "deleted-row ratio 0.200 >= 0.2"]


def test_bad_options_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match="target_rows_per_fragment"):
        CompactionConfig(target_rows_per_fragment=0)
    with pytest.raises(ValueError, match="max_deleted_ratio"):
        CompactionConfig(max_deleted_ratio=1.5)


def test_not_due_commits_nothing(local_location):
    loc = local_location
    fragmented_table(loc, base_rows=20)
    version = open_base(loc).version
    summary = compact_table(loc.uri, config=CompactionConfig())
    assert summary.due == [] and summary.tasks_committed == 0 and open_base(loc).version == version


def test_compaction_keeps_the_memwal_index_snapshot_and_remaps_indexes(location):
    """8 fragments of 10 rows, one region with 3 generations merged, caught up and snapshotted; compaction
    into one fragment must leave merged_generations, the snapshot, catch-up and the LSM view as they were,
    and the name index usable."""
    loc = location
    region = fragmented_table(loc, base_rows=80)
    write(loc, region, [([1, 2, 100], [3]), ([4, 101], [5]), ([6], [])])
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    catchup_table(MemWalTable(loc.uri, loc.storage_options))
    refresh_snapshot(MemWalTable(loc.uri, loc.storage_options))
    before = load_index(loc.uri, loc.storage_options)
    snapshot = read_snapshot(MemWalTable(loc.uri, loc.storage_options))
    expected = lsm(loc)
    assert fragment_health(open_base(loc), 1000).fragments > 8
    summary = compact_table(MemWalTable(loc.uri, loc.storage_options), CompactionConfig(target_rows_per_fragment=1000,
                                                                         max_small_fragments=2))
    assert summary.tasks_committed >= 1 and summary.health_after["fragments"] == 1, summary.to_dict()
    after = load_index(loc.uri, loc.storage_options)
    assert dict(after.merged_generations) == dict(before.merged_generations), "merged_generations must survive"
    assert after.details.index_catchup == before.details.index_catchup
    assert read_snapshot(MemWalTable(loc.uri, loc.storage_options)).equals(snapshot), "the region snapshot must survive"
    assert lsm(loc) == expected, "compaction must not change what readers see"
    ds = open_base(loc)
    assert ds.to_table(filter="name = 'w0-100'").num_rows == 1
    assert "ScalarIndexQuery" in ds.scanner(filter="name = 'w0-100'").explain_plan(), "the index was remapped"
    cu = catchup_table(MemWalTable(loc.uri, loc.storage_options))
    assert all(i.covered for i in cu.indexes), "catch-up still holds after compaction"


def test_merge_commits_first_then_untouched_tasks_are_committed(local_location):
    """Fragments {0,1} {2,3} {4,5} {6,7} planned as four tasks; a merge updating id 0 (fragment 0) commits
    between the tasks' execution and the compaction's commit. The commit is refused as preempted; the three
    tasks the merge did not touch are committed, and the fourth is planned again in a second round."""
    loc = local_location
    region = fragmented_table(loc, base_rows=80)
    write(loc, region, [([0], [])], tag="new")

    def execute_then_merge(tasks, table):
        results = execute_in_process(tasks, table)
        # lands between the plan's read version and the compaction's commit
        merge_table(MemWalTable(table.uri, table.storage_options))
        return results

    summary = compact_table(loc.uri, config=PAIRS, execute=execute_then_merge)
    assert summary.preempted_commits == 1 and summary.tasks_preempted == 1
    assert summary.rounds == 2 and summary.tasks_committed == summary.tasks_planned - 1 >= 4, summary.to_dict()
    assert base(loc)[0] == ("new0-0", 0.0) and len(base(loc)) == 80, "the merge's update must survive"
    assert load_index(loc.uri).merged_generations[region] == 1


def test_max_attempts_bounds_the_preempted_rounds(local_location):
    """`--max-attempts 1` (the tables file's compaction.max_attempts, the argv spark-submit gets): the first
    round a merge preempts ends the run with the error naming it; the next run plans again."""
    parser = argparse.ArgumentParser()
    add_job_arguments(parser, "compaction")
    options = job_options("compaction", parser.parse_args(["--max-attempts", "1"]))
    assert options.compaction.max_attempts == 1 and options.argv("compaction") == ["--max-attempts", "1"]
    good, bad = parse_tables({"tables": {"t": {"uri": "/t", "compaction": {"max_attempts": 2}},
                                         "u": {"uri": "/u", "compaction": {"max_attempts": 0}}}}, "src")
    assert good["t"].job_options().compaction.max_attempts == 2
    assert "key 'compaction.max_attempts': 0 is not >= 1" in str(bad["u"])
    loc = local_location
    region = fragmented_table(loc, base_rows=80)
    write(loc, region, [([0], [])], tag="new")

    def execute_then_merge(tasks, table):
        results = execute_in_process(tasks, table)
        merge_table(MemWalTable(table.uri, table.storage_options))  # commits before the compaction
        return results

    config = replace(PAIRS, max_attempts=options.compaction.max_attempts)
    summary = compact_table(loc.uri, config=config, execute=execute_then_merge)
    assert summary.preempted_commits == 1 and summary.rounds == 1, summary.to_dict()
    assert summary.error == f"compaction of {loc.uri} preempted 1 times by concurrent commits"
    assert base(loc)[0] == ("new0-0", 0.0), "the merge's update survives"


def test_compaction_commits_first_then_the_merge_retries(local_location):
    """A merge reads its generations and opens the table; a compaction commits before the merge's commit.
    The merge must still commit, with its rows and its merged_generations."""
    loc = local_location
    region = fragmented_table(loc, base_rows=80)
    write(loc, region, [([0, 15, 200], [33])], tag="new")
    compacted = []

    def dedup_then_compact(refs, pk, schema, store) -> MergeInput:
        data = local_dedup(refs, pk, schema, store)

        def open_upserts() -> pa.Table:
            if not compacted:
                compacted.append(compact_table(loc.uri, config=PAIRS))
            return data.open_upserts()

        return MergeInput(open_upserts, data.deleted_keys, data.rows_read, data.cleanup)

    summary = merge_table(loc.uri, dedup=dedup_then_compact)
    assert compacted and compacted[0].tasks_committed == 4, "the compaction committed first"
    assert not summary.failed_regions and load_index(loc.uri).merged_generations[region] == 1
    got = base(loc)
    assert got[0] == ("new0-0", 0.0) and got[200] == ("new0-200", 100.0) and 33 not in got
    assert len(got) == 80, "no row applied twice, none lost"


def test_tasks_pickle_across_the_executor_boundary(local_location):
    """What Spark does: tasks pickled to an executor, results pickled back, committed on the driver."""
    loc = local_location
    fragmented_table(loc, base_rows=40)
    expected = base(loc)

    def pickled(tasks, table):
        return [pickle.loads(pickle.dumps(r)) for r in
                execute_in_process([pickle.loads(pickle.dumps(t)) for t in tasks], pickle.loads(pickle.dumps(table)))]

    summary = compact_table(loc.uri, config=PAIRS, execute=pickled)
    assert summary.tasks_committed == 2 and summary.health_after["fragments"] == 2
    assert base(loc) == expected


def test_rounds_sliced_by_max_tasks_per_round(local_location):
    loc = local_location
    fragmented_table(loc, base_rows=80)
    config = CompactionConfig(force=True, target_rows_per_fragment=20, max_tasks_per_round=1)
    summary = compact_table(loc.uri, config=config)
    assert summary.rounds == 4 and summary.tasks_committed == 4 and summary.health_after["fragments"] == 4
    assert summary.lock_held_s > 0, "each round holds the MemWAL index lock"


def test_after_a_remapping_compaction_every_job_still_reads_the_history(local_location):
    """pylance 14.0.2 cannot list a remapping compaction's transaction, so recent transactions are read one
    by one; versions that retention removed earlier must then read as absent, not fail snapshot refresh
    (found by the model test: retention, merge, compaction, snapshot refresh)."""
    from memwal.retention import RetentionConfig, retain_versions

    loc = local_location
    region = fragmented_table(loc, base_rows=40)
    retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=1))
    write(loc, region, [([1, 50], [2])])
    merge_table(loc.uri)
    compact_table(loc.uri, config=PAIRS)
    assert refresh_snapshot(loc.uri, inline_threshold=0).storage == "external"
    assert read_snapshot(loc.uri).num_rows == 1
    assert load_index(loc.uri).merged_generations[region] == 1
    assert lsm(loc)[50] == ("w0-50", 25.0)


def test_catchup_preempted_by_a_compaction_records_nothing_and_the_next_run_catches_up(local_location, monkeypatch):
    """Catch-up optimises the index from version V0; a compaction commits first (found by the race test).
    Lance refuses the index commit as preempted: catch-up records nothing this run (no error), the next
    run records the merged generation."""
    from lance.dataset import DatasetOptimizer

    loc = local_location
    region = fragmented_table(loc, base_rows=40)
    write(loc, region, [([1, 50], [2])])
    merge_table(loc.uri)
    real = DatasetOptimizer.optimize_indices
    fired: list[bool] = []

    def compaction_first(self, **kwargs):
        if not fired:
            fired.append(True)
            compact_table(loc.uri, config=PAIRS)
        return real(self, **kwargs)

    monkeypatch.setattr(DatasetOptimizer, "optimize_indices", compaction_first)
    first = catchup_table(loc.uri)
    monkeypatch.undo()
    assert fired and first.indexes[0].error is None and not first.indexes[0].covered
    assert load_index(loc.uri).details.index_catchup.get("name_idx", {}).get(region, 0) == 0
    second = catchup_table(loc.uri)
    assert second.indexes[0].covered and load_index(loc.uri).details.index_catchup["name_idx"][region] == 1


def test_a_compaction_mixing_rows_merged_since_the_last_catch_up_reads_as_not_caught_up(local_location):
    """Catch-up at generation 1 | generation 2 merged (its rows unindexed) | a forced compaction:
    Lance's remap leaves the mixed fragment out of the index, so the index no longer covers every
    fragment and its catch-up entry is dropped (0: not caught up), not kept at 1; the next catch-up
    indexes it again and records 2. (Found by the model-based test.)"""
    loc = local_location
    region = fragmented_table(loc)
    write(loc, region, [([1, 100], [3])])
    merge_table(MemWalTable(loc.uri))
    catchup_table(MemWalTable(loc.uri))
    assert load_index(loc.uri).details.index_catchup == {"name_idx": {region: 1}}
    write(loc, region, [([2, 101], [])], tag="x")
    merge_table(MemWalTable(loc.uri))
    expected = lsm(loc)
    summary = compact_table(MemWalTable(loc.uri), CompactionConfig(force=True, target_rows_per_fragment=1000,
                                                                   use_lock=False))
    assert summary.error is None and summary.tasks_committed >= 1, summary.to_dict()
    assert "name_idx" not in indexes_covering_every_fragment(open_base(loc)), "the case needs a fragment left out"
    assert not load_index(loc.uri).details.index_catchup.get("name_idx", {}).get(region), \
        "an index that no longer covers every fragment must not read as caught up"
    assert lsm(loc) == expected
    cu = catchup_table(MemWalTable(loc.uri))
    assert all(i.covered for i in cu.indexes), cu
    assert load_index(loc.uri).details.index_catchup == {"name_idx": {region: 2}}


def test_a_zonemap_index_compaction_leaves_behind_reads_as_not_caught_up(local_location):
    """A ZONEMAP index, caught up at generation 1 | a forced compaction: Lance (pylance 14.0.2) does not remap a
    ZoneMap (after the rewrite it covers no fragment) yet keeps its index_catchup entry; compaction must set it
    to 0 (not caught up) until the next catch-up covers the rewritten fragments. (Found by the model-based
    test drawing more index types.)"""
    loc = local_location
    region = fragmented_table(loc)
    open_base(loc).create_scalar_index("score", "ZONEMAP", name="score_zm")
    write(loc, region, [([1, 100], [3])])
    merge_table(MemWalTable(loc.uri))
    catchup_table(MemWalTable(loc.uri))
    assert load_index(loc.uri).details.index_catchup.get("score_zm") == {region: 1}
    summary = compact_table(MemWalTable(loc.uri), CompactionConfig(force=True, target_rows_per_fragment=1000,
                                                                   use_lock=False))
    assert summary.error is None and summary.tasks_committed >= 1, summary.to_dict()
    assert "score_zm" not in indexes_covering_every_fragment(open_base(loc)), "the case needs Lance's non-remap"
    assert not load_index(loc.uri).details.index_catchup.get("score_zm", {}).get(region), \
        "an index that no longer covers every fragment must not read as caught up"
    catchup_table(MemWalTable(loc.uri))
    assert load_index(loc.uri).details.index_catchup.get("score_zm") == {region: 1}


def _fail_the_restore_once(monkeypatch) -> list[str]:
    """The next commit of compaction's index_catchup restore (under the lock) raises an OSError, once."""
    real, failed = MemWalTable.commit_details_locked, []

    def once(self, *args, **kwargs):
        if not failed:
            failed.append("restore")
            raise OSError("injected: the store refused the restore commit")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MemWalTable, "commit_details_locked", once)
    return failed


def test_a_failed_restore_never_lets_gc_remove_a_generation_merged_but_not_indexed(local_location, monkeypatch):
    """Generation 1 merged and caught up, generation 2 merged but not indexed; compaction commits (Lance's
    remap drops index_catchup, and leaves the mixed fragment out of the index) and its restore commit fails
    once. GC must not plan to remove generation 2 and status must show the lag, also after the next
    compaction run has put the entry back (0, which Lance does not keep: the index no longer covers every
    fragment); catch-up then records 2."""
    from datetime import timedelta

    from memwal.compaction import PENDING_CATCHUP
    from memwal.gc import GcConfig, gc_table
    from memwal.status import table_status

    loc = local_location
    region = fragmented_table(loc)
    write(loc, region, [([1, 100], [3])])
    merge_table(loc.uri)
    catchup_table(loc.uri)
    write(loc, region, [([2, 101], [])], tag="x")
    merge_table(loc.uri)
    assert load_index(loc.uri).details.index_catchup == {"name_idx": {region: 1}}
    failed = _fail_the_restore_once(monkeypatch)
    config = CompactionConfig(force=True, target_rows_per_fragment=1000)
    with pytest.raises(OSError, match="injected"):
        compact_table(loc.uri, config)
    assert failed and load_index(loc.uri).details.index_catchup == {}, "the case: Lance dropped every entry"
    assert "name_idx" not in indexes_covering_every_fragment(open_base(loc))
    assert loc.store().exists(PENDING_CATCHUP), "the entries were recorded before Lance's commit"
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))  # no retained version holds GC back

    plan = gc_table(loc.uri, config=GcConfig(dry_run=True)).regions[0]
    assert not [a for a in plan.actions if a.kind == "generation"], plan
    assert plan.safe_generation == 0 and plan.limited_by == "index_catchup[name_idx]"
    assert table_status(loc.uri).regions[0].index_lag_generations == 2

    rerun = compact_table(loc.uri, CompactionConfig())  # not due any more: it still handles the record
    assert rerun.due == [] and not loc.store().exists(PENDING_CATCHUP)
    assert not load_index(loc.uri).details.index_catchup.get("name_idx", {}).get(region), "0 (Lance keeps no 0)"
    assert gc_table(loc.uri, config=GcConfig(dry_run=True)).regions[0].safe_generation == 0, "still not caught up"
    assert catchup_table(loc.uri).indexes[0].covered
    assert load_index(loc.uri).details.index_catchup == {"name_idx": {region: 2}}
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    assert gc_table(loc.uri).regions[0].safe_generation == 2


def test_the_retry_of_a_compaction_whose_restore_failed_puts_the_entries_back(local_location, monkeypatch):
    """Everything merged is caught up; compaction's restore commit fails once after Lance's commit. The
    index still covers every fragment, so the retry restores the entry as it was (generation 2), and GC
    meanwhile reads the index as caught up from its coverage."""
    from datetime import timedelta

    from memwal.gc import GcConfig, gc_table

    loc = local_location
    region = fragmented_table(loc, base_rows=80)
    write(loc, region, [([1, 100], [3]), ([2, 101], [])])
    merge_table(loc.uri)
    catchup_table(loc.uri)
    before = load_index(loc.uri).details.index_catchup
    assert before == {"name_idx": {region: 2}}
    _fail_the_restore_once(monkeypatch)
    with pytest.raises(OSError, match="injected"):
        compact_table(loc.uri, CompactionConfig(force=True, target_rows_per_fragment=1000))
    assert load_index(loc.uri).details.index_catchup == {}
    assert "name_idx" in indexes_covering_every_fragment(open_base(loc))
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    assert gc_table(loc.uri, config=GcConfig(dry_run=True)).regions[0].safe_generation == 2
    compact_table(loc.uri, CompactionConfig(force=True, target_rows_per_fragment=1000))
    assert load_index(loc.uri).details.index_catchup == before


def test_a_round_whose_lease_was_taken_over_does_not_commit(local_location, monkeypatch):
    """
    compaction holds the MemWAL index lock | its tasks ran, it stalls past its lease before the commit |
    another job takes the lock over | the round must not commit (LeaseLostError, table version unchanged,
    rows intact) | once the lock is free again, a rerun compacts.
    """
    from memwal import compaction as compaction_module
    from memwal import table as table_module
    from memwal.errors import LeaseLostError
    from memwal.lock import TableLock

    loc = local_location
    fragmented_table(loc, base_rows=40)
    expected, v0 = base(loc), open_base(loc).version
    now = [1_000_000.0]
    monkeypatch.setattr(table_module, "index_lock", lambda store: TableLock(store, "mem_wal_index", 60.0,
                                                                              wait_s=5.0, clock=lambda: now[0]))
    taken: list[TableLock] = []

    def stall_and_lose_the_lease(name: str) -> None:
        if name == "compaction.before_commit" and not taken:
            now[0] += 120.0  # our lease (60 s) ran out while the tasks ran
            taken.append(TableLock(loc.store(), "mem_wal_index", 60.0, wait_s=5.0, clock=lambda: now[0]).acquire())

    monkeypatch.setattr(compaction_module, "fault_point", stall_and_lose_the_lease)
    locked = CompactionConfig(force=True, target_rows_per_fragment=20, use_lock=True)
    with pytest.raises(LeaseLostError, match="taken over"):
        compact_table(loc.uri, config=locked)
    assert taken, "the lease was never taken over"
    assert open_base(loc).version == v0, "the round committed after its lease was taken over"
    taken[0].release()
    summary = compact_table(loc.uri, config=locked)
    assert summary.tasks_committed == 2 and summary.health_after["fragments"] == 2
    assert base(loc) == expected
