import pytest

from memwal.catchup import catchup_table
from memwal.mem_wal_index import load_index
from memwal.merge import merge_table
from memwal.status import table_status

from support.maintenance import build_table, merge_region
from support.tables import open_base


def test_catchup_rebuilds_index_and_records_merged_generation(local_location):
    loc = local_location
    a, b = build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(loc.uri)
    before = open_base(loc).stats.index_stats("name_idx")
    assert before["num_unindexed_rows"] > 0, "merged rows start out unindexed"
    summary = catchup_table(loc.uri)
    result = summary.indexes[0]
    assert result.index_name == "name_idx" and result.optimized and result.covered
    assert open_base(loc).stats.index_stats("name_idx")["num_unindexed_rows"] == 0
    catchup = load_index(loc.uri).details.index_catchup["name_idx"]
    assert catchup == {a: 3, b: 3}
    assert all(r.index_lag_generations == 0 for r in table_status(loc.uri).regions)


def test_catchup_never_records_more_than_the_index_covers(local_location, monkeypatch):
    """Merges landing after catch-up read the table are not claimed."""
    import lance

    loc = local_location
    a, _ = build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_region(loc.uri, None, a, up_to_generation=1)
    real = lance.LanceDataset.describe_indices
    state = {"merged": False}

    def merge_meanwhile(self, *args, **kwargs):
        if not state["merged"]:
            state["merged"] = True
            merge_region(loc.uri, None, a)  # generations 2..3 land after V0
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "describe_indices", merge_meanwhile)
    catchup_table(loc.uri, index_names=["name_idx"])
    monkeypatch.undo()
    assert load_index(loc.uri).details.index_catchup["name_idx"][a] == 1, "only what V0 had merged"
    assert load_index(loc.uri).details.merged_generations[a] == 3


def test_a_commit_during_optimize_indices_does_not_stop_catch_up_recording_v0(local_location, monkeypatch):
    """Catch-up optimises the index from V0 (generation 1 merged); a merge of generations 2..3 commits while
    optimize_indices runs (forced: inside the call, before Lance's commit), so Lance rebases the index commit
    over it. The index covers every fragment of V0: catch-up records generation 1 (the merge's own new
    fragments are not V0's and are not claimed)."""
    from lance.dataset import DatasetOptimizer

    loc = local_location
    a, _ = build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_region(loc.uri, None, a, up_to_generation=1)
    v0 = open_base(loc).version
    real = DatasetOptimizer.optimize_indices
    fired: list[int] = []

    def merge_meanwhile(self, **kwargs):
        if not fired:
            fired.append(merge_region(loc.uri, None, a).merged_generation_after)  # generations 2..3
        return real(self, **kwargs)

    monkeypatch.setattr(DatasetOptimizer, "optimize_indices", merge_meanwhile)
    summary = catchup_table(loc.uri, index_names=["name_idx"])
    monkeypatch.undo()
    [result] = summary.indexes
    assert fired == [3] and summary.read_version == v0 and result.optimized and result.error is None
    assert result.covered and result.uncovered_fragments == [], result
    assert load_index(loc.uri).details.index_catchup["name_idx"] == {a: 1}, "V0's merged generation is recorded"
    assert load_index(loc.uri).details.merged_generations[a] == 3


def test_a_storage_409_is_a_failure_not_a_preemption(local_location, monkeypatch):
    """A store's "409 Conflict" during the index commit is an error catch-up reports (the CLI then exits 3),
    not Lance's preemption by a concurrent commit, which stays an expected outcome (see
    test_compaction.py::test_catchup_preempted_by_a_compaction_records_nothing_and_the_next_run_catches_up)."""
    from lance.dataset import DatasetOptimizer

    from memwal.cli import main
    from memwal.compaction import is_preempted
    from memwal.jobs import EXIT_PARTIAL

    loc = local_location
    build_table(loc, regions=1, generations=1)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(loc.uri)
    s3_409 = OSError("Generic S3 error: Error performing PUT http://s3/bucket/t.lance/_versions/5.manifest in "
                     "12ms - Server returned non-2xx status code: 409 Conflict: <Code>ConditionalRequestConflict"
                     "</Code> (a concurrent conflicting operation is in progress)")

    def refused_by_the_store(self, **kwargs):
        raise s3_409

    monkeypatch.setattr(DatasetOptimizer, "optimize_indices", refused_by_the_store)
    summary = catchup_table(loc.uri).to_dict()
    assert main(["catchup", loc.uri]) == EXIT_PARTIAL, "the command reports it (exit 3), not 0"
    monkeypatch.undo()
    assert summary["failed_indexes"] == ["name_idx"] and "409 Conflict" in summary["indexes"][0]["error"]
    assert "name_idx" not in load_index(loc.uri).details.index_catchup
    assert not is_preempted(s3_409) and not is_preempted(ValueError("conflict"))
    # What pylance 14.0.2 raises when a concurrent commit preempts compaction's or catch-up's commit:
    for op, other in (("Rewrite", "Update"), ("Rewrite", "Delete"), ("Rewrite", "Rewrite"),
                      ("CreateIndex", "Rewrite"), ("CreateIndex", "CreateIndex")):
        assert is_preempted(OSError(
            f"Retryable commit conflict for version 7: This {op} transaction was preempted by concurrent "
            f"transaction {other} at version 7. Please retry., /home/runner/work/lance/lance/rust/lance/src/io/"
            "commit/conflict_resolver.rs:1471:46"))


def _dropped_index_table(loc) -> str:
    """Base with BTREE sidx (name) and tidx (score), MemWAL maintaining ["sidx", "tidx"], one region's four
    generations merged (each index then misses the merged rows), then sidx dropped from the base table."""
    import uuid

    from support.maintenance import write_generations
    from support.tables import create_base

    ds = create_base(loc)
    ds.create_scalar_index("name", "BTREE", name="sidx")
    ds.create_scalar_index("score", "BTREE", name="tidx")
    open_base(loc).initialize_mem_wal(unsharded=True, maintained_indexes=["sidx", "tidx"])
    region = str(uuid.uuid4())
    write_generations(loc, region, [([100 + g], f"g{g}", []) for g in range(4)])
    merge_table(loc.uri)
    open_base(loc).drop_index("sidx")
    return region


@pytest.mark.parametrize("path", ["in_process", "distributed"])
def test_a_maintained_index_dropped_from_the_base_is_skipped_and_does_not_hold_back_gc(local_location, caplog,
                                                                                      path):
    """Issue 40 item 4: maintained ["sidx", "tidx"], sidx dropped from the base. Catch-up skips sidx with a
    warning naming the table and the index (on the distributed path too, where it raised StopIteration and
    tidx was never recorded), catches tidx up to the merged generation, and GC's safe generation is the merged
    one: neither index holds it back."""
    import logging

    from memwal.catchup import DistributedBuild
    from memwal.gc import safe_generation
    from memwal.index_coverage import with_coverage
    from memwal.table import MemWalTable
    from memwal.task_runner import in_process

    loc = local_location
    region = _dropped_index_table(loc)
    build = DistributedBuild(in_process, groups=2, where="tasks", min_rows=0, min_group_rows=1) \
        if path == "distributed" else None
    with caplog.at_level(logging.WARNING, logger="memwal.catchup"):
        summary = catchup_table(loc.uri, distributed=build)
    out = summary.to_dict()
    sidx, tidx = summary.indexes
    assert sidx.index_name == "sidx" and "not on the base table" in (sidx.skipped or ""), sidx
    assert not sidx.optimized and sidx.error is None
    assert out["skipped_indexes"] == ["sidx"] and out["uncovered_indexes"] == [] and out["failed_indexes"] == []
    assert [m for m in caplog.messages if "sidx" in m and loc.uri in m and "not on the base table" in m], \
        caplog.messages
    assert tidx.covered and tidx.caught_up_generations == {region: 4}, tidx
    if build is not None:
        assert tidx.where == "tasks" and tidx.segments_built >= 1, "the distributed path was taken"
    assert load_index(loc.uri).details.index_catchup == {"tidx": {region: 4}}
    table = MemWalTable(loc.uri)
    names = table.maintained_indexes()
    assert names == ["sidx", "tidx"]
    index = with_coverage(table.index, table.dataset, names)
    assert safe_generation(index, region, names, {}) == (4, "merged_generations")


def test_lance_core_keeps_no_index_catchup_entry_for_an_index_not_on_the_base(local_location):
    """What GC relies on for a dropped maintained index (pylance 14.0.2): drop_index removes the index's
    index_catchup entry (maintained_indexes keeps the name), and a details commit that writes an entry for it
    anyway (compaction's restore of saved entries, a rebase floor) is stored without it. So a dropped index has
    no entry, reads as nothing to wait for (memwal.index_coverage.with_coverage), and GC's safe generation
    is the merged one."""
    import uuid
    from dataclasses import replace

    from memwal.gc import safe_generation
    from memwal.index_coverage import with_coverage
    from memwal.table import MemWalTable

    from support.maintenance import write_generations
    from support.tables import create_base

    loc = local_location
    ds = create_base(loc)
    ds.create_scalar_index("name", "BTREE", name="sidx")
    open_base(loc).initialize_mem_wal(unsharded=True, maintained_indexes=["sidx"])
    region = str(uuid.uuid4())
    write_generations(loc, region, [([100 + g], f"g{g}", []) for g in range(4)])
    merge_region(loc.uri, None, region, up_to_generation=1)
    catchup_table(loc.uri)
    assert load_index(loc.uri).details.index_catchup == {"sidx": {region: 1}}
    merge_table(loc.uri)
    open_base(loc).drop_index("sidx")
    table = MemWalTable(loc.uri)
    assert table.details.index_catchup == {} and table.details.maintained_indexes == ("sidx",)
    table.commit_details(lambda d: replace(d, index_catchup={**d.index_catchup, "sidx": {region: 1}}))
    assert table.details.index_catchup == {}, "Lance core stores no entry for an index the base does not have"
    index = with_coverage(table.index, table.dataset, ["sidx"])
    assert safe_generation(index, region, ["sidx"], {}) == (4, "merged_generations")


def test_the_primary_key_btree_is_caught_up_without_being_listed(local_location):
    """The spec maintains the primary key's BTREE implicitly and does not list it: with maintained ["sidx"],
    catch-up still brings the key's BTREE (pk) up to date with the merged rows (memwal.maintained_indexes)."""
    import uuid

    from support.maintenance import write_generations
    from support.tables import create_base

    loc = local_location
    ds = create_base(loc)
    ds.create_scalar_index("name", "BTREE", name="sidx")
    ds.create_scalar_index("id", "BTREE", name="pk")
    open_base(loc).initialize_mem_wal(unsharded=True, maintained_indexes=["sidx"])
    write_generations(loc, str(uuid.uuid4()), [([100], "g0", [])])
    merge_table(loc.uri)
    summary = catchup_table(loc.uri)
    assert [(r.index_name, r.covered) for r in summary.indexes] == [("sidx", True), ("pk", True)]
    assert open_base(loc).stats.index_stats("pk")["num_unindexed_rows"] == 0


def test_rebuild_skips_a_maintained_index_dropped_from_the_base(local_location):
    """The catch-up operator's `rebuild` of the maintained indexes rebuilds tidx and skips sidx (dropped from
    the base); naming sidx explicitly is still an error naming it."""
    from memwal.catchup import rebuild_indexes
    from memwal.table import MemWalTable

    loc = local_location
    _dropped_index_table(loc)
    table = MemWalTable(loc.uri)
    assert rebuild_indexes(table) == ["tidx"]
    with pytest.raises(ValueError, match="no index named sidx"):
        rebuild_indexes(table, ["sidx"])


def test_the_catchup_plan_does_not_count_a_maintained_index_dropped_from_the_base(local_location):
    """The plan the engines choose by counts only indexes catch-up builds: sidx (dropped) adds no rows."""
    from memwal.job_config import JobOptions
    from memwal.job_plans import plan_catchup
    from memwal.table import MemWalTable

    _dropped_index_table(local_location)
    table = MemWalTable(local_location.uri)
    plan = plan_catchup(table, JobOptions(), None)
    uncovered_tidx = sum(f.metadata.physical_rows for f in table.dataset.get_fragments()
                         if f.fragment_id not in (_covered(table, "tidx")))
    assert plan.facts["rows_to_index"] == uncovered_tidx > 0, plan


def _covered(table, name) -> set[int]:
    from memwal.index_coverage import covered_fragments

    return covered_fragments(table.dataset, name) or set()
