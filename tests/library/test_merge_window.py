"""Issue 32: no merger that commits between two of our commits can leave the base holding an older row than
merged_generations claims (memwal.merge_commit: progress moves one generation per commit).

Each test runs our merge of a batch of several generations on one apply path (the two passes, the fragment
apply's lookup path, its scan path) and, at a point between two of our commits, lets another merger commit
an OLDER generation of the same region: Lance core's own merger (`merge_insert(...).mark_sstables_as_compacted`,
no lock of ours), or one of ours that takes no lock. Our next commit must be refused and the merge replanned,
so that the LSM view is exact at every table version and the fully merged base equals the model. A merger
whose lease on our lock was taken over must stop before its next commit.
"""

from __future__ import annotations

import uuid

import lance
import pytest
from lance.mem_wal import CompactedSsTable

from memwal import merge_apply, merge_commit
from memwal import table as table_module
from memwal.errors import LeaseLostError
from memwal.lock import TableLock
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig, merge_table

from support.apply_runner import use_fragment_apply
from support.maintenance import merge_region, merge_without_our_lock, write_generations
from support.merge_passes import exact_everywhere, lsm_view
from support.pass_order import force_deletes_first
from support.tables import lance_core_scan, open_base, rows, view

BATCH = 3  # generations per commit: a region's whole backlog in one commit


@pytest.fixture(params=["passes", "upserts_first", "lookup", "scan"])
def path(request, monkeypatch) -> str:
    """Every test on each apply path: the two passes deletes first (forced) and upserts first (what
    `merge_commit.plan_passes` picks when every tombstone of the batch lies above its first generation, as
    in CASES), the fragment apply through the key lookup, and through the scan (tiny tables would always
    take one of them by the cost rule)."""
    if request.param == "passes":
        force_deletes_first(monkeypatch)
    elif request.param != "upserts_first":
        use_fragment_apply(monkeypatch)
        monkeypatch.setattr(merge_apply, "use_index", lambda ds, keys, pk=(): request.param == "lookup")
    return request.param


def _table(loc, gens) -> str:
    """Base ids 0..9 with a BTREE on the key, MemWAL, one region with generations gens (put, tag, deletes)."""
    lance.write_dataset(rows(range(10), "base"), loc.uri)
    open_base(loc).create_scalar_index("id", "BTREE")
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(loc, region, gens)
    return region


def _once_at(monkeypatch, points: tuple[str, ...], action) -> list[str]:
    """Run action() the first time our merge reaches one of the fault points (in merge_commit or
    merge_apply); returns the points reached, in order."""
    hits: list[str] = []

    def hooked(name: str) -> None:
        if name in points:
            hits.append(name)
            if len(hits) == 1:
                action()

    for module in (merge_commit, merge_apply):
        monkeypatch.setattr(module, "fault_point", hooked)
    return hits


def _before_commit(monkeypatch, nth: int, action) -> list[int]:
    """Run action() right before our nth commit under the lock: after its progress check (or none, when the
    version is the one our previous step made) and its lease check, just before Lance commits it. Our
    commits, in order: the two passes' delete pass, upsert pass, marker steps; the fragment apply's Update,
    marker commit, marker steps. The tightest window there is."""
    calls: list[int] = []
    real = table_module.MemWalTable.check_lease

    def hooked(table) -> None:
        real(table)
        calls.append(table.version)
        if len(calls) == nth:
            action()

    monkeypatch.setattr(table_module.MemWalTable, "check_lease", hooked)
    return calls


# the point between our first data commit and the commit that carries the first marker step, per path
BETWEEN_DATA_AND_MARKER = {"passes": "merge.between_passes", "upserts_first": "merge.between_passes",
                           "lookup": "merge.between_update_and_marker", "scan": "merge.between_update_and_marker"}
# our commit that carries the first marker step: the upsert pass after the delete pass; upserts first, the
# upsert pass itself (our first commit: no data of ours lands before a marker); the marker commit after the
# fragment apply's Update
FIRST_MARKER_COMMIT = {"passes": 2, "upserts_first": 1, "lookup": 2, "scan": 2}


def _lance_core_merges(loc, region: str, generation: int, upserts) -> None:
    """Lance core's own merger: one merge-insert of a generation's rows with its marker, no lock of ours."""
    (open_base(loc).merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
     .mark_sstables_as_compacted([CompactedSsTable(region, generation)]).execute(upserts))


CASES = {
    # gen 1 | gen 2 (the reproduction: an update of base key 5 beside fresh keys)
    # (gen 2 also deletes base key 3, so that the two passes have a delete pass to race after)
    "update_and_fresh": [([5], "g1", []), ([5, 50000], "g2", [3])],
    "updates_and_fresh": [([5, 6, 7], "g1", []), ([5, 6, 7, 50000, 50001], "g2", [3])],
    # a key our batch deletes, which the older generation re-inserts
    "deleted_key": [([7, 50000], "g1", []), ([5], "g2", [7, 50000])],
}


@pytest.mark.parametrize("merger", ["lance_core", "ours_unlocked"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_older_generation_merged_between_our_data_and_our_marker_is_merged_over_again(
        local_location, monkeypatch, path, case, merger):
    """
    base 0..9 | gen 1 and gen 2 of one region, merged by us in one commit | after our first data commit
    (the delete pass, or the fragment apply's Update) AND right before our marker commit commits,
    another merger merges gen 1 alone, writing gen 1's rows over our gen 2 rows and recording merged
    generation 1 | our marker must not then claim gen 2: Lance refuses it as stale, we replan from 1 and
    merge gen 2 again: the base ends with gen 2's rows.
    """
    loc = local_location
    gens = CASES[case]
    region = _table(loc, gens)
    model, v0 = lsm_view(loc), open_base(loc).version

    def other() -> None:
        if merger == "lance_core":
            _lance_core_merges(loc, region, 1, rows(gens[0][0], gens[0][1]))
        else:
            merge_without_our_lock(loc.uri, None, region, config=MergeConfig(apply="passes"), up_to_generation=1)

    checks = _before_commit(monkeypatch, FIRST_MARKER_COMMIT[path], other)
    ours = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=BATCH))
    assert len(checks) >= FIRST_MARKER_COMMIT[path], "the other merger never ran between our commits"
    assert ours.conflicts == 1 and ours.generations == [2], (
        "our first marker must be refused once the other merger recorded generation 1, and gen 2 merged again")
    assert load_index(loc.uri).merged_generations[region] == 2
    exact_everywhere(loc, v0, model)
    assert view(lance_core_scan(loc)) == model


@pytest.mark.parametrize("merger", ["lance_core", "ours_unlocked"])
def test_a_merger_between_two_marker_steps_makes_the_next_step_stale(local_location, monkeypatch, path, merger):
    """
    base 0..9 | gens 1, 2, 3 update key 5 (and gen 3 inserts fresh 50000) | our commit of 1..3: data, then
    marker 1 | right before our step 2 commits, another merger merges gen 2 alone (gen 2's key 5 over our
    gen 3 row), recording 2 | our step to 2 is stale: we replan from 2 and merge gen 3 again, whose key 5
    wins.
    """
    loc = local_location
    gens = [([5], "g1", []), ([5], "g2", []), ([5, 50000], "g3", [])]
    region = _table(loc, gens)
    model, v0 = lsm_view(loc), open_base(loc).version

    def other() -> None:
        if merger == "lance_core":
            _lance_core_merges(loc, region, 2, rows([5], "g2"))
        else:
            merge_without_our_lock(loc.uri, None, region, config=MergeConfig(apply="passes"), up_to_generation=2)

    step_two = 2 if path in ("passes", "upserts_first") else 3  # the upsert pass (step 1), or the Update + marker
    checks = _before_commit(monkeypatch, step_two, other)
    ours = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=BATCH))
    assert len(checks) >= step_two, "our commit of three generations made no marker-only step"
    # the refused commit is reported as a conflict as a whole (its first step is counted as merged by others)
    assert ours.conflicts == 1 and ours.generations == [3], "step 2 refused, gen 3 merged again after it"
    assert view(open_base(loc).to_table())[5] == ("g35", 2.5), "gen 3's row of key 5 must win"
    exact_everywhere(loc, v0, model)


def test_progress_moves_one_generation_per_commit(local_location, monkeypatch, path):
    """A batch of three generations: the data commit(s) record generation 1, then one marker-only commit
    each for 2 and 3; a batch of one generation makes no marker-only commit."""
    loc = local_location
    region = _table(loc, [([5], "g1", []), ([6], "g2", [3]), ([7], "g3", [])])
    v0 = open_base(loc).version
    merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=BATCH))
    from memwal.mem_wal_index import read_details_at

    recorded = [read_details_at(loc.store(), v).merged_generations.get(region, 0)
                for v in range(v0, open_base(loc).version + 1)]
    assert recorded[-3:] == [1, 2, 3] and recorded == sorted(recorded), recorded
    assert recorded.count(1) == 1, "generation 1 is recorded by the last data commit, with no data after it"
    v1 = open_base(loc).version
    write_generations(loc, region, [([8], "g4", [])])
    merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=BATCH))
    data_commits = 1 if path in ("passes", "upserts_first") else 2  # one upsert pass; or the Update + the marker commit
    assert open_base(loc).version - v1 == data_commits, "a one-generation batch must cost no extra commit"


class _Clock:
    """The wall clock of the test's leases: moved by hand, so a lease expires exactly when the test says."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_merger_whose_lease_was_taken_over_makes_no_further_commit(local_location, monkeypatch, path):
    """
    our merge holds the MemWAL index lock | it stalls past its lease after its first data commit | another
    job takes the lock over | our merge must not make its next commit (LeaseLostError, nothing committed
    after the takeover) | once the other job releases the lock, a rerun merges the rest: exact.
    """
    loc = local_location
    region = _table(loc, [([5], "g1", []), ([5, 50000], "g2", [7])])
    model, v0 = lsm_view(loc), open_base(loc).version
    clock = _Clock()
    monkeypatch.setattr(table_module, "index_lock", lambda store: TableLock(store, "mem_wal_index", 60.0,
                                                                              wait_s=5.0, clock=clock))
    taken: list[TableLock] = []
    versions: list[int] = []

    def stall_and_lose_the_lease() -> None:
        clock.now += 120.0  # our lease (60 s) ran out while we stalled
        other = TableLock(loc.store(), "mem_wal_index", 60.0, wait_s=5.0, clock=clock).acquire()
        taken.append(other)
        versions.append(open_base(loc).version)

    _once_at(monkeypatch, (BETWEEN_DATA_AND_MARKER[path],), stall_and_lose_the_lease)
    summary = merge_table(loc.uri, [region], MergeConfig(max_generations_per_commit=BATCH))
    assert taken, "the lease was never taken over"
    assert summary.failed_regions == [region]
    assert "taken over" in summary.regions[0].error, summary.regions[0].error
    assert open_base(loc).version == versions[0], "a commit was made after our lease was taken over"
    assert lsm_view(loc) == model, "the view after the stopped merge differs from the model"
    taken[0].release()
    monkeypatch.undo()
    rerun = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=BATCH))
    assert rerun.merged_generation_after == 2
    exact_everywhere(loc, v0, model)


def test_check_refuses_a_lease_that_expired_or_was_taken_over(local_location):
    """TableLock.check: fine while held and fresh; LeaseLostError once expired, and once another holder
    took it over."""
    clock = _Clock()
    store = local_location.store()
    ours = TableLock(store, "t", 60.0, clock=clock).acquire()
    try:
        ours.check()
        clock.now += 61.0
        with pytest.raises(LeaseLostError, match="expired"):
            ours.check()
        TableLock(store, "t", 60.0, clock=clock).acquire()
        with pytest.raises(LeaseLostError, match="taken over"):
            ours.check()
    finally:
        ours._stop.set()
