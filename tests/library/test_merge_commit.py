"""memwal.merge_commit: which pass goes first and which marker steps each commit carries (issue 44: one
merge commit at Lance's floor). The races around the passes are in test_merge_passes.py and
test_merge_window.py."""

import pytest

from memwal.mem_wal_index import read_details_at
from memwal.merge import MergeConfig
from memwal.merge_commit import PassOrder, plan_passes, use_index, use_index_to_delete

from support.maintenance import merge_region
from support.merge_passes import exact_everywhere, lsm_view, passes_table
from support.tables import open_base, rows

TWO = MergeConfig(max_generations_per_commit=2)


def test_upserts_go_first_only_when_every_region_can_carry_its_first_step_there():
    since = {"a": 0, "b": 4}
    markers = [("a", 2), ("b", 7)]
    # every tombstone above since+1: the upsert pass carries a1 b5, the delete pass a2 b6, then b7 alone
    up = plan_passes(markers, since, {"a": (1, 2), "b": (5, None)}, True, True)
    assert up == PassOrder(True, [("a", 1), ("b", 5)], [("a", 2), ("b", 6)], [[("b", 7)]])
    # region b has a tombstone in its first generation (5): deletes first, every first step on the upsert pass
    default = PassOrder(False, [], [("a", 1), ("b", 5)], [[("a", 2), ("b", 6)], [("b", 7)]])
    assert plan_passes(markers, since, {"a": (1, 2), "b": (5, 5)}, True, True) == default
    assert plan_passes(markers, since, {"a": (1, 2)}, True, True) == default, "b's winners unknown"
    assert plan_passes(markers, since, {}, True, True) == default
    # one generation per region: nothing to save
    one = [("a", 1), ("b", 5)]
    assert plan_passes(one, since, {"a": (1, None), "b": (5, None)}, True, True).upserts_first is False
    # one pass only: it carries the first steps
    assert plan_passes(markers, since, {"a": (1, 2), "b": (5, 6)}, True, False) == default
    assert plan_passes(markers, since, {"a": (None, 1), "b": (None, 5)}, False, True) == default


def test_the_delete_pass_joins_through_the_index_on_a_table_with_deletion_files_down_to_50_rows_per_key(
        local_location):
    """A `when_matched_delete` through the index pays the BTREE pages its keys fall in; the key scan of a table
    with deletion files is cut into ranges (measured crossover 20-80 rows per key, bench/README.md): the delete
    pass takes the index from 50 rows per key there, the upsert pass keeps 1,500; on a clean table both 10,000."""
    import lance

    loc = local_location
    lance.write_dataset(rows(range(30_000)), loc.uri, max_rows_per_file=10_000)
    ds = open_base(loc)
    assert use_index_to_delete(ds, 3) and not use_index_to_delete(ds, 4), "clean: 3 x 10,000 <= 30,000 < 4 x"
    ds.delete("id = 7")
    ds = open_base(loc)
    assert use_index_to_delete(ds, 600) and not use_index_to_delete(ds, 601), "600 keys x 50 <= 30,000 < 601 x 50"
    assert not use_index(ds, 600), "the upsert pass: 600 x 1,500 > 30,000"
    open_base(loc).create_scalar_index("id", "BTREE")
    ds = open_base(loc)
    assert use_index_to_delete(ds, rows(range(0, 30_000, 50)), ["id"]), "600 keys within the index's range"
    assert not use_index_to_delete(ds, rows(range(0, 30_000, 40)), ["id"]), "750 keys within it"


def _recorded(loc, region: str, v0: int) -> list[int]:
    return [read_details_at(loc.store(), v).merged_generations.get(region, 0)
            for v in range(v0, open_base(loc).version + 1)]


def test_a_batch_whose_tombstones_lie_above_its_first_generation_costs_one_commit_less(local_location):
    """gen 1 updates 5 and inserts 20; gen 2 inserts 21 and deletes 3: the upsert pass carries marker 1,
    the delete pass marker 2: two Lance commits, not three (no marker-only commit)."""
    loc = local_location
    region = passes_table(loc, [([5, 20], "g1", []), ([21], "g2", [3])])
    model, v0 = lsm_view(loc), open_base(loc).version
    res = merge_region(loc.uri, None, region, TWO)
    assert res.generations == [1, 2] and res.rows_deleted == 1
    assert open_base(loc).version - v0 == 2, "an upsert pass and a delete pass, each with its marker step"
    assert _recorded(loc, region, v0) == [0, 1, 2]
    exact_everywhere(loc, v0, model)


@pytest.mark.parametrize("gens", [
    [([20], "g1", [3]), ([21], "g2", [])],  # a tombstone in the first generation
    [([20], "g1", [3]), ([21], "g2", [4])],
], ids=["first-only", "both"])
def test_a_tombstone_in_the_first_generation_keeps_the_deletes_first(local_location, gens):
    """Marker 1 on the upsert pass would claim gen 1 while its tombstone of 3 is not applied (3 would come
    back for every reader): the delete pass goes first, the upsert pass carries 1, a marker-only commit 2."""
    loc = local_location
    region = passes_table(loc, gens)
    model, v0 = lsm_view(loc), open_base(loc).version
    merge_region(loc.uri, None, region, TWO)
    assert open_base(loc).version - v0 == 3
    assert _recorded(loc, region, v0) == [0, 0, 1, 2]
    exact_everywhere(loc, v0, model)


class _Stopped(BaseException):
    """The merge stopped dead at a fault point (what a SIGKILL there leaves; tests/crash does it for real)."""


def test_a_merge_stopped_between_upserts_first_passes_leaves_the_exact_view_and_the_rerun_converges(
        local_location, monkeypatch):
    """
    gen 1 updates 5, inserts 20; gen 2 inserts 21, deletes 3 and 20 | the upsert pass commits with marker 1
    (5 and 21; 20 not inserted, its newest version is gen 2's tombstone; base key 3 stays, shadowed by that
    tombstone) | the merge stops there | our reader and Lance core's see the model | the rerun merges gen 2
    alone (deletes 3) and the base equals the model.
    """
    from memwal import merge_commit

    from support.tables import lance_core_scan, view

    loc = local_location
    region = passes_table(loc, [([5, 20], "g1", []), ([21], "g2", [3, 20])])
    model, v0 = lsm_view(loc), open_base(loc).version
    assert 3 not in model and 20 not in model
    real = merge_commit.fault_point

    def stop(name: str) -> None:
        real(name)
        if name == "merge.between_passes":
            raise _Stopped

    monkeypatch.setattr(merge_commit, "fault_point", stop)
    with pytest.raises(_Stopped):
        merge_region(loc.uri, None, region, TWO)
    monkeypatch.undo()
    assert _recorded(loc, region, v0) == [0, 1], "only the upsert pass landed, with marker 1"
    ids = set(open_base(loc).to_table().column("id").to_pylist())
    assert 3 in ids and 20 not in ids and 21 in ids, "3 waits for the delete pass, shadowed by gen 2's tombstone"
    assert lsm_view(loc) == model and view(lance_core_scan(loc)) == model
    rerun = merge_region(loc.uri, None, region, TWO)
    assert rerun.generations == [2] and 3 not in set(open_base(loc).to_table().column("id").to_pylist())
    exact_everywhere(loc, v0, model)
