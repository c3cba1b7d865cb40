"""A merge commit's two passes (memwal.merge_commit): the interleavings between and around them, each
forced deterministically at the point between the passes (the `merge.between_passes` fault point) or
right after a pass's progress check.

Each test ends with the LSM view checked at EVERY table version a reader can open (our reader pinned to
it), merged_generations never going back, and the fully merged base table equal to the model.
"""

import uuid

import lance
import pyarrow as pa
import pytest
from lance.mem_wal import CompactedSsTable
from lance.optimize import Compaction, CompactionOptions

from memwal import merge_commit
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig

from support.maintenance import merge_region, merge_without_our_lock
from support.merge_passes import exact_everywhere, lsm_view, passes_table
from support.pass_order import force_deletes_first
from support.tables import lance_core_scan, open_base, rows, view

ONE = MergeConfig(max_generations_per_commit=1)
# gen 1 deletes base keys 3 and 4 and inserts 20, 21; gen 2 re-inserts 3 and deletes 20; gen 3 updates 21
GENS = [([20, 21], "g1", [3, 4]), ([3], "g2", [20]), ([21], "g3", [])]


@pytest.fixture(autouse=True, params=["index", "scan"])
def join_path(request, monkeypatch) -> str:
    """Every interleaving on both of the passes' join paths (tiny tables would always scan)."""
    for name in ("use_index", "use_index_to_delete"):
        monkeypatch.setattr(merge_commit, name, lambda ds, keys, pk=(), **kw: request.param == "index")
    return request.param


def _base_ids(loc) -> set[int]:
    return set(open_base(loc).to_table().column("id").to_pylist())


def _between_passes(monkeypatch, action) -> None:
    """Run action(n) the n-th time a merge is between its delete pass and its upsert pass."""
    real, hits = merge_commit.fault_point, []

    def hooked(name: str) -> None:
        real(name)
        if name == "merge.between_passes":
            hits.append(name)
            action(len(hits))

    monkeypatch.setattr(merge_commit, "fault_point", hooked)


def _after_check(monkeypatch, action) -> list[int]:
    """Run action(n) right after the n-th progress check of a pass (before the pass executes); returns
    the table versions the checks saw."""
    real, seen = merge_commit.check_progress, []

    def hooked(table, since):
        real(table, since)
        seen.append(table.version)
        action(len(seen))

    monkeypatch.setattr(merge_commit, "check_progress", hooked)
    return seen


def test_a_reader_between_the_passes_sees_the_exact_lsm_view(local_location, monkeypatch):
    """
    delete pass committed (the keys are gone from the base, the marker has not moved) | a reader, ours
    and Lance core's | the upsert pass with the marker. The tombstones still sit in unmerged generations
    and shadow the base, so the view is exact.
    """
    loc = local_location
    region = passes_table(loc, GENS)
    model, v0 = lsm_view(loc), open_base(loc).version
    seen = []

    def read(n: int) -> None:
        seen.append((n, sorted({3, 4, 20} - _base_ids(loc)), load_index(loc.uri).merged_generations))
        assert lsm_view(loc) == model, "our reader between the passes differs from the model"
        assert view(lance_core_scan(loc)) == model, "Lance core's reader between the passes differs"

    _between_passes(monkeypatch, read)
    assert merge_region(loc.uri, None, region, ONE).generations == [1, 2, 3]
    # gen 1's delete pass removed 3 and 4 (20 not inserted yet); gen 2's removed 20 (3 comes back in its
    # upsert pass); gen 3 has no deletes: one pass, nothing in between
    assert seen == [(1, [3, 4, 20], {}), (2, [3, 4, 20], {region: 1})], seen
    exact_everywhere(loc, v0, model)


def test_a_merger_without_our_lock_reinserting_a_deleted_key_before_our_delete_pass(local_location, monkeypatch):
    """
    we plan gen 1 (deletes base key 5) and check progress at version v | a merger that does not take
    our lock merges gens 1..2 (gen 2 re-inserts 5) | our delete pass, run against v, conflicts on 5's old
    row. Lance's own retry would rerun it on the latest version and delete the re-inserted 5 (no marker to
    refuse it); with retries off we reopen, see progress moved, and plan again: nothing left to merge.
    """
    loc = local_location
    region = passes_table(loc, [([20], "g1", [5]), ([5], "g2", [])])
    model, v0 = lsm_view(loc), open_base(loc).version
    assert model[5] == ("g25", 2.5)

    def other_merger(n: int) -> None:
        if n == 1:
            merge_without_our_lock(loc.uri, None, region)

    checks = _after_check(monkeypatch, other_merger)
    ours = merge_region(loc.uri, None, region, ONE)
    assert checks[0] == v0, "our delete pass was checked at the version we planned from"
    assert ours.conflicts == 1 and ours.generations == [] and ours.generations_merged_by_others == 2
    exact_everywhere(loc, v0, model)


def test_lance_retry_of_a_delete_pass_deletes_a_key_reinserted_meanwhile(local_location):
    """Why merge_commit turns Lance's retry off: a delete pass from version v that conflicts is rerun by
    Lance on the latest version, where it deletes the row a later commit re-inserted."""
    loc = local_location
    passes_table(loc, [])
    stale = open_base(loc)
    open_base(loc).merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
        rows([5], "later"))
    keys = pa.table({"id": pa.array([5], pa.int64())})
    stale.merge_insert("id").when_matched_delete().execute(keys)  # Lance's default: 10 retries
    assert 5 not in _base_ids(loc), "Lance reran the delete on the latest version: the re-insert is gone"


def test_a_merger_without_our_lock_between_our_passes(local_location, monkeypatch):
    """
    we plan gens 1..2 (gen 1 updates base key 5, gen 2 deletes it) | our delete pass removes 5 | a merger
    that does not take our lock merges gen 1 only and so re-inserts 5 (marker 1) | our upsert pass, whose
    marker 2 Lance would accept over 1, sees progress moved and is not run; we plan again from 1 and
    delete 5 for good.
    """
    loc = local_location
    force_deletes_first(monkeypatch)
    region = passes_table(loc, [([5], "g1", []), ([20], "g2", [5])])
    model, v0 = lsm_view(loc), open_base(loc).version
    assert 5 not in model

    def other_merger(n: int) -> None:
        if n == 1:
            assert 5 not in _base_ids(loc)
            merge_without_our_lock(loc.uri, None, region, up_to_generation=1)
            assert 5 in _base_ids(loc) and load_index(loc.uri).merged_generations == {region: 1}

    _between_passes(monkeypatch, other_merger)
    ours = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=2))
    assert ours.conflicts == 1 and ours.generations == [2] and ours.generations_merged_by_others == 1
    exact_everywhere(loc, v0, model)


def test_upserts_first_a_merger_without_our_lock_between_our_passes(local_location, monkeypatch):
    """
    we plan gens 1..2 (gen 1 updates base key 5, gen 2 deletes it and inserts 20): every tombstone lies
    above gen 1, so the upsert pass goes first and carries marker 1 | it inserts 20 (5 keeps its base row:
    its newest version is gen 2's tombstone, which still shadows it) | a merger that does not take our lock
    merges gen 2 (marker 2) | our delete pass, carrying marker 2, sees progress moved and is not run: we
    plan again and find nothing left. The view is exact at every version.
    """
    loc = local_location
    region = passes_table(loc, [([5], "g1", []), ([20], "g2", [5])])
    model, v0 = lsm_view(loc), open_base(loc).version
    seen = []

    def other_merger(n: int) -> None:
        if n == 1:
            seen.append((5 in _base_ids(loc), 20 in _base_ids(loc), load_index(loc.uri).merged_generations))
            merge_without_our_lock(loc.uri, None, region)
            assert 5 not in _base_ids(loc) and load_index(loc.uri).merged_generations == {region: 2}

    _between_passes(monkeypatch, other_merger)
    ran = _passes(monkeypatch)
    ours = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=2))
    assert seen == [(True, True, {region: 1})], "the upsert pass went first, with marker 1"
    assert ran[0][0] == "upsert" and ran[0][3] == "ok", ran
    # the refused commit is reported as a conflict as a whole (its first step counts as merged by others)
    assert ours.conflicts == 1 and ours.generations == [] and ours.generations_merged_by_others == 2
    assert load_index(loc.uri).merged_generations == {region: 2}
    exact_everywhere(loc, v0, model)


def test_upserts_first_a_merger_without_our_lock_before_our_upsert_pass(local_location, monkeypatch):
    """
    we plan gens 1..2 upserts first and check progress | a merger that does not take our lock merges gen 1
    (inserting fresh key 20 with gen 1's value) | our upsert pass, which also inserts 20 (gen 2's value),
    carries marker 1: Lance refuses it as stale (or it conflicts), so 20 is never inserted twice; we plan
    again from 1 and merge gen 2.
    """
    loc = local_location
    region = passes_table(loc, [([20], "g1", []), ([20, 21], "g2", [3])])
    model, v0 = lsm_view(loc), open_base(loc).version

    def other_merger(n: int) -> None:
        if n == 1:  # our upsert pass's check
            merge_without_our_lock(loc.uri, None, region, up_to_generation=1)

    _after_check(monkeypatch, other_merger)
    ran = _passes(monkeypatch)
    ours = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=2))
    ours_first = [p for p in ran if p[0] == "upsert"]
    assert ours_first and ours_first[-1][3] == "ok" and any(p[3] != "ok" for p in ran), ran
    assert ours.conflicts == 1 and ours.generations == [2] and ours.generations_merged_by_others == 1
    ids = open_base(loc).to_table().column("id").to_pylist()
    assert sorted(ids) == sorted(set(ids)), "a key inserted twice"
    exact_everywhere(loc, v0, model)


def test_a_compaction_between_the_passes(local_location, monkeypatch):
    """Our delete pass | a compaction rewrites the fragments (materialising its deletions) | our upsert
    pass runs on the compacted version."""
    loc = local_location
    region = passes_table(loc, GENS, fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    fragments = []

    def compact(n: int) -> None:
        before = len(open_base(loc).get_fragments())
        open_base(loc).optimize.compact_files(target_rows_per_fragment=1000, materialize_deletions_threshold=0.0)
        fragments.append((before, len(open_base(loc).get_fragments())))

    _between_passes(monkeypatch, compact)
    ours = merge_region(loc.uri, None, region, ONE)
    assert len(fragments) == 2 and fragments[0] == (4, 1), fragments  # 4 fragments of 3 rows into one
    assert ours.generations == [1, 2, 3] and ours.conflicts == 0
    exact_everywhere(loc, v0, model)


def test_a_compaction_committing_inside_a_pass_is_a_conflict_we_rerun(local_location, monkeypatch):
    """
    the upsert pass checks progress at version v | a compaction commits | the pass, run against v,
    conflicts (Lance's retry is off) | we reopen, check progress again (unchanged) and rerun the pass:
    no replan, the marker moves once.
    """
    loc = local_location
    region = passes_table(loc, [([7, 20], "g1", [3])], fragment_rows=3)  # the update of 7 touches a fragment
    model, v0 = lsm_view(loc), open_base(loc).version

    def compact(n: int) -> None:
        if n == 2:  # the upsert pass's first check (the first is the delete pass's)
            open_base(loc).optimize.compact_files(target_rows_per_fragment=1000)

    checks = _after_check(monkeypatch, compact)
    ours = merge_region(loc.uri, None, region, ONE)
    assert len(checks) == 3 and checks[2] > checks[1], "the upsert pass conflicted and ran again, compacted"
    assert ours.generations == [1] and ours.conflicts == 0
    exact_everywhere(loc, v0, model)


def test_a_compaction_planned_before_the_passes_and_committed_between_them_is_refused(local_location, monkeypatch):
    """A compaction planned and executed before our delete pass commits after it: Lance refuses the
    compaction (retryable conflict: it rewrote fragments our pass changed); our merge is unaffected."""
    loc = local_location
    region = passes_table(loc, GENS[:1], fragment_rows=3)
    model, v0 = lsm_view(loc), open_base(loc).version
    options = CompactionOptions(target_rows_per_fragment=1000)
    plan = Compaction.plan(open_base(loc), options)
    rewrites = [task.execute(open_base(loc)) for task in plan.tasks]
    refused = []

    def commit_compaction(n: int) -> None:
        try:
            Compaction.commit(open_base(loc), rewrites, options)
        except OSError as exc:
            refused.append(str(exc))

    _between_passes(monkeypatch, commit_compaction)
    assert merge_region(loc.uri, None, region, ONE).generations == [1]
    assert len(refused) == 1 and "conflict" in refused[0].lower(), refused
    exact_everywhere(loc, v0, model)


def _passes(monkeypatch) -> list[tuple[str, int, bool, str]]:
    """Record every pass that ran: (what, the version it read (-1 if it raised), whether it read (if it
    raised: was offered) the version before our delete pass, 'ok' or the error it raised)."""
    real, ran = merge_commit.run_pass, []

    def spy(table, since, execute, what, pinned=None, known=None):
        try:
            stats, read, before = real(table, since, execute, what, pinned, known)
        except OSError as exc:
            ran.append((what, -1, pinned is not None, type(exc).__name__))
            raise
        ran.append((what, read, before, "ok"))
        return stats, read, before

    monkeypatch.setattr(merge_commit, "run_pass", spy)
    return ran


def test_the_upsert_pass_reads_the_version_before_our_delete_pass_and_keeps_its_deletions(local_location,
                                                                                           monkeypatch):
    """
    our delete pass reads v and commits v+1 | our upsert pass reads v (no fresh deletion ranges in its
    key scan) and Lance rebases it onto v+1: both deletion vectors kept, the deleted keys stay deleted.
    """
    loc = local_location
    region = passes_table(loc, GENS, fragment_rows=3)  # the deletes and the updates share fragments
    model, v0 = lsm_view(loc), open_base(loc).version
    ran = _passes(monkeypatch)
    assert merge_region(loc.uri, None, region, ONE).generations == [1, 2, 3]
    # gens 1 and 2 carry deletes and upserts; gen 3 upserts only (one pass, on the latest version)
    (d1, u1), (d2, u2), (u3,) = ran[0:2], ran[2:4], ran[4:]
    assert [p[0] for p in ran] == ["delete", "upsert", "delete", "upsert", "upsert"], ran
    for d, u in ((d1, u1), (d2, u2)):
        assert u[2] and u[1] == d[1], f"the upsert pass did not read the version our delete pass read: {ran}"
    assert not u3[2]
    assert {3, 4, 20} - _base_ids(loc) == {4, 20}  # 3 re-inserted by gen 2, 4 and 20 deleted for good
    exact_everywhere(loc, v0, model)


@pytest.mark.parametrize("stable_row_ids", [False, True], ids=["row-addresses", "stable-row-ids"])
def test_lance_rebases_an_upsert_read_before_a_delete_and_keeps_both_deletion_vectors(local_location,
                                                                                      stable_row_ids):
    """What the pinned upsert pass relies on, in Lance core alone: an upsert with the marker read at v,
    committed after a Delete at v+1 of other rows of the same fragments (one of them deleted whole), is
    rebased onto it (retries off): the Delete's rows stay deleted, the updates replace their rows once."""
    loc = local_location
    lance.write_dataset(rows(range(10), "base"), loc.uri, max_rows_per_file=3,  # [0..2] [3..5] [6..8] [9]
                        enable_stable_row_ids=stable_row_ids)
    open_base(loc).create_scalar_index("id", "BTREE")
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    before = open_base(loc)
    v = before.version
    open_base(loc).delete("id IN (1, 3, 4, 5)", conflict_retries=0)  # [3..5] goes whole
    before.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().mark_sstables_as_compacted(
        [CompactedSsTable(region, 1)]).conflict_retries(0).execute(rows([0, 2, 7, 30], "new"))
    after = open_base(loc)
    assert after.version == v + 2
    got = after.to_table().sort_by("id")
    assert got.column("id").to_pylist() == [0, 2, 6, 7, 8, 9, 30]
    assert view(got) == {**view(rows([6, 8, 9], "base")), **view(rows([0, 2, 7, 30], "new"))}
    assert load_index(loc.uri).merged_generations == {region: 1}


def test_a_merger_without_our_lock_commits_after_the_check_of_an_upsert_pass_read_before_our_delete(
        local_location, monkeypatch):
    """
    our delete pass (gen 1 deletes base key 3) | our upsert pass checks progress, then is to read the
    version before our delete | a merger that does not take our lock merges gens 1..2 (gen 2 updates 20,
    which gen 1 inserts) | our upsert, read before both, would insert gen 1's 20 beside gen 2's: Lance
    refuses it (stale marker or conflict), we plan again and find nothing left to merge.
    """
    loc = local_location
    region = passes_table(loc, [([20], "g1", [3]), ([20], "g2", [])])
    model, v0 = lsm_view(loc), open_base(loc).version
    assert model[20] == ("g220", 10.0) and 3 not in model

    def other_merger(n: int) -> None:
        if n == 2:  # our upsert pass's first check
            merge_without_our_lock(loc.uri, None, region)
            assert load_index(loc.uri).merged_generations == {region: 2}

    _after_check(monkeypatch, other_merger)
    ran = _passes(monkeypatch)
    ours = merge_region(loc.uri, None, region, ONE)
    assert ran[0] == ("delete", v0, False, "ok"), ran
    upsert = [p for p in ran if p[0] == "upsert" and p[2]]  # the other merger's, then ours
    assert upsert and upsert[-1][3] != "ok", f"our upsert read before our delete was not refused: {ran}"
    assert ours.conflicts == 1 and ours.generations == [] and ours.generations_merged_by_others == 2
    exact_everywhere(loc, v0, model)


def test_a_composite_key_deletes_with_a_merge_insert_and_upserts_on_the_latest_version(local_location,
                                                                                     monkeypatch):
    """On a composite key the delete pass is a merge-insert `when_matched_delete` (Lance's delete would
    need an OR of ANDs no index serves), and the upsert pass reads the latest version: rows that share one
    key column but not the other are kept apart."""
    from memwal.writer import RegionWriter

    loc = local_location
    pos = "lance-schema:unenforced-primary-key:position"
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False, metadata={pos: "1"}),
                        pa.field("b", pa.int64(), nullable=False, metadata={pos: "2"}),
                        pa.field("v", pa.string())])

    def t(keys, tag):
        return pa.table({"a": [k[0] for k in keys], "b": [k[1] for k in keys],
                         "v": [f"{tag}{k}" for k in keys]}, schema=schema)

    base = [(1, 1), (1, 2), (2, 1), (2, 2)]
    lance.write_dataset(t(base, "base"), loc.uri, max_rows_per_file=2)
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region) as w:
        w.put(t([(1, 1), (3, 1)], "g1"))  # update (1, 1), insert (3, 1)
        w.delete(pa.table({"a": pa.array([1, 2], pa.int64()), "b": pa.array([2, 1], pa.int64())}))
        w.flush()
    ran = _passes(monkeypatch)
    assert merge_region(loc.uri, None, region, ONE).generations == [1]
    assert [(p[0], p[2], p[3]) for p in ran] == [("delete", False, "ok"), ("upsert", False, "ok")], ran
    got = {(r["a"], r["b"]): r["v"] for r in open_base(loc).to_table().to_pylist()}
    assert got == {(1, 1): "g1(1, 1)", (2, 2): "base(2, 2)", (3, 1): "g1(3, 1)"}
