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
