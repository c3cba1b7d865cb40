"""Merge: ascending order, last write wins, tombstones delete, progress in the same commit, races."""

import uuid

import pyarrow as pa
import pytest

from memwal import merge as merge_mod
from memwal import naming
from memwal.mem_wal_index import load_index, read_details_at
from memwal.merge import MergeConfig, merge_table
from memwal.reader import LsmReader
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.maintenance import merge_region, write_generations
from support.pass_order import force_deletes_first
from support.tables import create_base, open_base, rows, sorted_rows

ONE_GEN_PER_FLUSH = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)


def _table_with_generations(loc, region, gens):
    """gens: list of (put_ids, tag, delete_ids), one flushed generation each."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    write_generations(loc, region, gens)


GENS = [
    ([1, 2, 11], "g1", [3]),
    ([2, 3], "g2", [11]),  # re-inserts 3, deletes 11 from gen 1
    ([4], "g3", [1, 4]),  # inserts then deletes 4 in one generation: the later row (tombstone) wins
    ([1], "g4", []),
]


def test_full_merge_equals_the_lsm_view(location):
    region = str(uuid.uuid4())
    _table_with_generations(location, region, GENS)
    before = sorted_rows(LsmReader(MemWalTable(location.uri, location.storage_options)).scan())
    summary = merge_table(MemWalTable(location.uri, location.storage_options))
    assert summary.regions[0].generations == [1, 2, 3, 4]
    after_base = sorted_rows(open_base(location).to_table())
    assert after_base == before, "the base table after a full merge must equal the LSM view before it"
    names = {r["id"]: r["name"] for r in after_base}
    assert names[1] == "g41" and names[2] == "g22" and names[3] == "g23"
    assert 4 not in names and 11 not in names, "tombstones must delete"
    assert load_index(location.uri, location.storage_options).merged_generations == {region: 4}


def test_merged_generations_advances_in_the_same_commit_as_the_data(local_location):
    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, GENS[:2])
    v0 = open_base(loc).version
    merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=1))
    # each commit: a delete pass (marker unchanged), then the upsert pass that moves the marker
    got = [(read_details_at(loc.store(), v).merged_generations.get(region, 0),
            sorted(open_base(loc, v).to_table().column("id").to_pylist())) for v in range(v0 + 1, v0 + 5)]
    assert open_base(loc).version == v0 + 4
    assert got == [(0, [0, 1, 2, 4, 5, 6, 7, 8, 9]), (1, [0, 1, 2, 4, 5, 6, 7, 8, 9, 11]),
                   (1, [0, 1, 2, 4, 5, 6, 7, 8, 9]), (2, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])], (
        "generation g is recorded in the very version that holds the last of its data, and only there")


def test_batches_are_bounded_by_generation_count_and_bytes(local_location):
    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, [([i], f"g{i}", []) for i in range(1, 6)])
    r = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=2))
    assert r.commits == 3 and r.generations == [1, 2, 3, 4, 5]
    region2 = str(uuid.uuid4())
    with RegionWriter(loc.uri, region2, config=ONE_GEN_PER_FLUSH) as w:
        for i in range(3):
            w.put(rows([100 + i]))
            w.flush()
    r2 = merge_region(loc.uri, None, region2, MergeConfig(max_bytes_per_commit=1))
    assert r2.commits == 3, "a byte budget smaller than one generation still merges one per commit"


def test_appendix_2_racing_on_the_same_generation(local_location, monkeypatch):
    """
    index: merged 0 | A and B both read merged=0 and plan generation 1
    A commits generation 1 first; B's commit is refused as stale; B reloads and goes on to 2.
    """
    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, GENS[:2])
    real_commit = merge_mod._commit
    raced = []

    def commit_after_a_wins(table, markers, data, since=None, *apply):
        if not raced:
            raced.append(markers)
            merge_region(table.uri, table.storage_options, markers[0][0],
                         MergeConfig(max_generations_per_commit=1))  # merger A
        return real_commit(table, markers, data, since, *apply)

    monkeypatch.setattr(merge_mod, "_commit", commit_after_a_wins)
    b = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=1))
    assert b.conflicts == 1, "B's stale marker must be refused"
    assert b.generations == [] and b.generations_merged_by_others == 2
    assert load_index(loc.uri).merged_generations[region] == 2
    assert sorted_rows(open_base(loc).to_table())[1]["name"] == "g11"


def test_appendix_2_crash_after_table_commit(local_location, monkeypatch):
    """A merges generation 1 and crashes before reporting; B skips 1 and merges 2."""
    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, GENS[:2])
    real_commit = merge_mod._commit

    def commit_then_crash(*args):
        real_commit(*args)
        raise KeyboardInterrupt("merger A crashed after its commit")

    monkeypatch.setattr(merge_mod, "_commit", commit_then_crash)
    with pytest.raises(KeyboardInterrupt):
        merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=1))
    monkeypatch.setattr(merge_mod, "_commit", real_commit)
    assert load_index(loc.uri).merged_generations[region] == 1
    b = merge_region(loc.uri, None, region)
    assert b.merged_generation_before == 1 and b.generations == [2]


def test_generations_merged_and_collected_by_another_merger_while_we_read_them(local_location):
    """
    B plans generations 1..2; before B reads them, merger A merges 1..3 and GC collects their directories,
    so B's read fails (found by the race test with a Spark merger, whose job widens that window). B was
    overtaken, as with a stale marker: it reloads and finds nothing left; the region does not fail.
    """
    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, GENS[:3])
    expected = sorted_rows(LsmReader(loc.uri).scan())
    store = loc.store()
    raced = []

    def dedup(refs, pk, schema, store_):
        if not raced:
            raced.append([r.generation for r in refs])
            merge_region(loc.uri, None, region)  # merger A
            for r in refs:  # GC collects what A merged
                store.delete_prefix(naming.generation_dir(region, r.path))
        return merge_mod.local_dedup(refs, pk, schema, store_)

    b = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=2), dedup=dedup)
    assert raced == [[1, 2]]
    assert not b.failed_regions, [r.error for r in b.regions]
    (res,) = b.regions
    assert res.conflicts == 1 and res.generations == [] and res.generations_merged_by_others == 3
    assert sorted_rows(open_base(loc).to_table()) == expected


def test_a_missing_generation_nobody_merged_still_fails_the_region(local_location):
    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, GENS[:2])
    store = loc.store()

    def dedup(refs, pk, schema, store_):
        store.delete_prefix(naming.generation_dir(region, refs[0].path))  # lost, not merged
        return merge_mod.local_dedup(refs, pk, schema, store_)

    summary = merge_table(loc.uri, dedup=dedup)
    (res,) = summary.regions
    assert summary.failed_regions == [region] and "generation 1" in res.error and res.conflicts == 0
    assert load_index(loc.uri).merged_generations.get(region, 0) == 0


def test_merge_refuses_a_gap_in_the_region_manifest(local_location):
    from memwal.region_manifest import commit_manifest, load_latest_manifest

    loc = local_location
    region = str(uuid.uuid4())
    _table_with_generations(loc, region, GENS[:3])
    m = load_latest_manifest(loc.store(), region)
    commit_manifest(loc.store(), m.next_version(flushed_generations=m.flushed_generations[1:]))
    summary = merge_table(loc.uri)
    assert "generation 1 is not in the region manifest" in summary.regions[0].error
    assert open_base(loc).version == 2, "nothing may be committed for a region with a gap"


def test_unknown_region_is_reported_not_merged(local_location):
    loc = local_location
    _table_with_generations(loc, str(uuid.uuid4()), GENS[:1])
    bogus = str(uuid.uuid4())
    summary = merge_table(loc.uri, regions=[bogus])
    assert summary.failed_regions == [bogus] and "no manifest" in summary.regions[0].error


# -- several regions per commit ------------------------------------------------------------------------


def _regions_table(loc, n_regions: int, n_gens: int) -> list[str]:
    """Base 0..9; region k writes keys 100*(k+1)+g and updates base key k, one generation per flush; the
    region ids in merge order (sorted)."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    regions = sorted(str(uuid.uuid4()) for _ in range(n_regions))
    for k, region in enumerate(regions):
        with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=ONE_GEN_PER_FLUSH) as w:
            for g in range(1, n_gens + 1):
                w.put(rows([100 * (k + 1) + g, k], f"r{k}g{g}-"))
                if g == n_gens:
                    w.delete(pa.table({"id": pa.array([100 * (k + 1) + 1], pa.int64())}))
                w.flush()
    return regions


def _marker_advances(loc, v0: int) -> list[dict[str, int]]:
    """Per table version after v0 that advanced a merged generation (a delete pass advances none): the
    regions whose merged generation it advanced, and to what."""
    out, before = [], read_details_at(loc.store(), v0).merged_generations
    for v in range(v0 + 1, open_base(loc).version + 1):
        now = read_details_at(loc.store(), v).merged_generations
        advanced = {r: g for r, g in now.items() if g != before.get(r, 0)}
        if advanced:
            out.append(advanced)
        before = now
    return out


def test_one_commit_carries_the_markers_of_several_regions(local_location):
    loc = local_location
    regions = _regions_table(loc, 3, 2)
    v0 = open_base(loc).version
    before = sorted_rows(LsmReader(loc.uri).scan())
    summary = merge_table(loc.uri)
    assert summary.table_commits == 2 and open_base(loc).version == v0 + 2, (
        "6 generations fit one commit; every tombstone is in generation 2, so the upsert pass (first) carries "
        "step 1 and the delete pass step 2: no marker-only commit")
    assert _marker_advances(loc, v0) == [dict.fromkeys(regions, 1), dict.fromkeys(regions, 2)], (
        "every region's marker moves in the same commits, one generation per commit")
    assert sorted_rows(open_base(loc).to_table()) == before
    assert [r.commits for r in summary.regions] == [1, 1, 1] and summary.commits == 3
    assert [r.rows_upserted for r in summary.regions] == [2, 2, 2], "key k and 100*(k+1)+2 per region"
    assert [r.rows_deleted for r in summary.regions] == [1, 1, 1]


def test_commit_budgets_hold_per_region_batch_and_over_all_regions_of_a_commit(local_location):
    loc = local_location
    regions = _regions_table(loc, 3, 2)
    v0 = open_base(loc).version
    before = sorted_rows(LsmReader(loc.uri).scan())
    summary = merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1))
    advances = _marker_advances(loc, v0)
    assert summary.table_commits == 3, (
        "2 generations per region exceed the count of 1: every region's generation 1 in one commit (no "
        "tombstone there: one upsert pass), then every region's generation 2 in one more (a delete pass, "
        "an upsert pass)")
    assert advances == [dict.fromkeys(regions, 1), dict.fromkeys(regions, 2)], advances
    summary = merge_table(loc.uri)
    assert summary.table_commits == 0
    assert sorted_rows(open_base(loc).to_table()) == before

    loc2 = type(loc)(loc.kind, loc.uri + "-2", loc.storage_options)
    _regions_table(loc2, 2, 2)
    v0 = open_base(loc2).version
    summary = merge_table(loc2.uri, config=MergeConfig(max_bytes_per_commit=1))
    assert summary.table_commits == 6 and all(len(a) == 1 for a in _marker_advances(loc2, v0)), (
        "a byte budget smaller than one generation: one generation of one region per commit")


def test_a_stale_marker_refuses_the_whole_commit_and_the_other_regions_go_on(local_location, monkeypatch):
    """
    A and B planned into one commit | another merger merges A first | our commit is refused as a whole
    (A's marker is stale) | we reload: A is done by the other, B is merged now, exactly once.
    """
    loc = local_location
    a, b = _regions_table(loc, 2, 2)
    before = sorted_rows(LsmReader(loc.uri).scan())
    v0 = open_base(loc).version
    real = merge_mod._commit
    calls = []

    def other_merger_first(table, markers, data, since=None, *apply):
        calls.append(list(markers))
        if len(calls) == 1:
            assert [r for r, _ in markers] == [a, b], "both regions planned into one commit"
            merge_region(table.uri, table.storage_options, a)  # the other merger (its own commit of A)
        return real(table, markers, data, since, *apply)

    monkeypatch.setattr(merge_mod, "_commit", other_merger_first)
    summary = merge_table(loc.uri)
    ra, rb = summary.regions
    assert not summary.failed_regions
    assert ra.conflicts == rb.conflicts == 1, "the refused commit counts for both of its regions"
    assert ra.generations == [] and ra.generations_merged_by_others == 2
    assert rb.generations == [1, 2] and rb.commits == 1
    assert calls[2:] == [[(b, 2)]], "after the reload only B is committed, once"
    assert _marker_advances(loc, v0) == [{a: 1}, {a: 2}, {b: 1}, {b: 2}], (
        "A by the other merger, then B, one generation per commit: nothing twice")
    assert sorted_rows(open_base(loc).to_table()) == before


def test_a_failing_commit_of_several_regions_is_retried_region_by_region(local_location, monkeypatch):
    loc = local_location
    a, b, c = _regions_table(loc, 3, 1)
    real = merge_mod._commit
    attempts = []

    def b_cannot_commit(table, markers, data, since=None, *apply):
        attempts.append([r for r, _ in markers])
        if any(r == b for r, _ in markers):
            raise OSError("injected: B's commit fails")
        return real(table, markers, data, since, *apply)

    monkeypatch.setattr(merge_mod, "_commit", b_cannot_commit)
    summary = merge_table(loc.uri, config=MergeConfig(max_attempts=3))
    assert attempts[0] == [a, b, c] and all(len(x) == 1 for x in attempts[1:]), "then one region per commit"
    assert summary.failed_regions == [b] and "failed 3 times" in summary.regions[1].error
    assert load_index(loc.uri).merged_generations == {a: 1, c: 1}
    assert [r.generations for r in summary.regions] == [[1], [], [1]]


def test_plan_commits_packs_whole_region_batches_in_order():
    from memwal.merge import GenerationRef, plan_commits

    def refs(region, n, size=10):
        return [GenerationRef(region, g, f"g{g}", "", size) for g in range(1, n + 1)]

    def shape(commits):
        return [[(b[0].region_id, b[0].generation, b[-1].generation) for b in c] for c in commits]

    assert shape(plan_commits([refs("a", 20), refs("b", 2)], MergeConfig())) == [
        [("a", 1, 8), ("b", 1, 2)], [("a", 9, 16)], [("a", 17, 20)]], "b joins the first commit with room"
    # the generation count is per region batch: regions share a commit within the byte budget alone
    assert shape(plan_commits([refs("a", 3), refs("b", 3)], MergeConfig(max_generations_per_commit=4))) == [
        [("a", 1, 3), ("b", 1, 3)]]
    assert shape(plan_commits([refs("a", 5), refs("b", 3)], MergeConfig(max_generations_per_commit=4))) == [
        [("a", 1, 4), ("b", 1, 3)], [("a", 5, 5)]]
    assert shape(plan_commits([refs("a", 2), refs("b", 2)], MergeConfig(max_bytes_per_commit=1))) == [
        [("a", 1, 1)], [("a", 2, 2)], [("b", 1, 1)], [("b", 2, 2)]], "a byte budget below one generation"
    assert shape(plan_commits([refs("a", 3), refs("b", 1)], MergeConfig(max_generations_per_commit=1,
                                                                       max_commits_per_round=2))) == [
        [("a", 1, 1), ("b", 1, 1)], [("a", 2, 2)]], "a's generation 3 waits for the next round"
    assert shape(plan_commits([refs(x, 2) for x in "abcdef"], MergeConfig(max_bytes_per_commit=80,
                                                                         max_commits_per_round=2))) == [
        [("a", 1, 2), ("b", 1, 2), ("c", 1, 2), ("d", 1, 2)], [("e", 1, 2), ("f", 1, 2)]]
    assert shape(plan_commits([refs(x, 2) for x in "abcdefghij"], MergeConfig(max_bytes_per_commit=40,
                                                                             max_commits_per_round=2))) == [
        [("a", 1, 2), ("b", 1, 2)], [("c", 1, 2), ("d", 1, 2)]]
    assert len(plan_commits([refs(str(i), 2) for i in range(64)], MergeConfig())) == 1, (
        "64 regions of 2 small generations: one commit")
    assert shape(plan_commits([refs("a", 2), refs("b", 2)], MergeConfig(max_bytes_per_commit=25))) == [
        [("a", 1, 2)], [("b", 1, 2)]]
    assert shape(plan_commits([refs(x, 1) for x in "abc"], MergeConfig(), regions_per_commit=1)) == [
        [("a", 1, 1)], [("b", 1, 1)], [("c", 1, 1)]]


def test_a_pass_joins_through_the_index_only_for_a_source_small_against_the_table(local_location):
    import lance

    from memwal.merge_commit import use_index

    loc = local_location
    lance.write_dataset(rows(range(30_000)), loc.uri, max_rows_per_file=10_000)
    ds = open_base(loc)
    assert use_index(ds, 3) and not use_index(ds, 4), "3 keys x 10,000 <= 30,000 rows < 4 x 10,000"
    ds.delete("id = 7")  # a deletion file: the key scan costs more per row
    ds = open_base(loc)
    assert use_index(ds, 20) and not use_index(ds, 21), "20 keys x 1,500 <= 30,000 < 21 x 1,500"


def test_keys_beyond_the_key_index_range_cost_the_index_nothing(local_location):
    """An append stream's fresh keys lie beyond the key index's [min, max]: the pass joins through the index
    however many there are; keys within it count as before; no key index: every key counts; no rows: scan."""
    import lance

    from memwal.merge_commit import use_index

    loc = local_location
    lance.write_dataset(rows(range(30_000)), loc.uri, max_rows_per_file=10_000)
    assert not use_index(open_base(loc), rows(range(30_000, 30_100)), ["id"]), "no index: 100 keys count"
    open_base(loc).create_scalar_index("id", "BTREE")
    ds = open_base(loc)
    assert use_index(ds, rows(range(30_000, 130_000)), ["id"]), "100,000 keys, all beyond the index's max"
    assert use_index(ds, rows([*range(3), *range(40_000, 50_000)]), ["id"]), "3 keys within: 3 x 10,000 <= 30,000"
    assert not use_index(ds, rows(range(0, 30_000, 1000)), ["id"]), "30 keys within: 300,000 > 30,000 rows"
    assert not use_index(ds, rows([]), ["id"]) and not use_index(ds, 0), "nothing to join: no index"


def test_a_lock_timeout_keeps_what_was_merged_and_names_the_lock(local_location):
    """Two regions, one commit each. The first commits; then another owner (a long compaction round) holds
    the MemWAL index lock and the merge gives up waiting for it before the second region's commit. The
    summary keeps the first region's generations (generations_merged, its result: what the Airflow asset
    event is made from) and reports the second as failed, naming the lock, its holder and the wait; a
    rerun once the lock is free merges the second."""
    from memwal.lock import TableLock
    from memwal.merge import local_dedup

    loc = local_location
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    for i in range(2):
        write_generations(loc, str(uuid.uuid4()), [([100 + i], f"r{i}", [])])
    table = MemWalTable(loc.uri)
    table.index_lock = lambda: TableLock(table.store, "mem_wal_index", wait_s=0)  # this handle's waits only
    holder = TableLock(loc.store(), "mem_wal_index", lease_s=600)
    deduped: list[str] = []

    def dedup_then_lock(refs, pk, schema, store):
        deduped.append(refs[0].region_id)
        if len(deduped) == 2:  # the first region has committed: a compaction round takes the lock now
            holder.acquire()
        return local_dedup(refs, pk, schema, store)

    try:
        summary = merge_table(table, config=MergeConfig(max_bytes_per_commit=1), dedup=dedup_then_lock)
    finally:
        holder.release()
    first, second = deduped
    out = summary.to_dict()
    by_region = {r["region_id"]: r for r in out["regions"]}
    assert out["generations_merged"] == 1 and out["failed_regions"] == [second], out
    assert by_region[first]["generations"] == [1] and by_region[first]["error"] is None
    assert by_region[first]["merged_generation_after"] == 1 and by_region[first]["commits"] == 1
    error = by_region[second]["error"]
    assert "_mem_wal/_locks/mem_wal_index" in error and f"held by {holder.owner}" in error, error
    assert "gave up after waiting 0s" in error and "rerun" in error, error
    assert dict(load_index(loc.uri).merged_generations) == {first: 1}
    rerun = merge_table(loc.uri)
    assert rerun.to_dict()["generations_merged"] == 1 and not rerun.failed_regions
    assert dict(load_index(loc.uri).merged_generations) == {first: 1, second: 1}



# -- a lease lost mid-run (issue 41, item 7) -----------------------------------------------------------


class _Lease:
    """Our merge's MemWAL index locks judged by a hand-moved clock (monkeypatched in); `take_over()` makes
    us stall past the lease and another job take the lock over, deterministically. Release `takers`."""

    def __init__(self, monkeypatch, loc, on_acquire=lambda n: False):
        from memwal import table as table_module
        from memwal.lock import TableLock

        self.now, self.loc, self.takers, self.acquired = 1_000_000.0, loc, [], 0
        lease = self

        class Judged(TableLock):
            def acquire(self) -> TableLock:
                super().acquire()
                lease.acquired += 1
                if on_acquire(lease.acquired):
                    lease.take_over()
                return self

        self.lock_type = TableLock
        monkeypatch.setattr(table_module, "index_lock",
                            lambda store: Judged(store, "mem_wal_index", 60.0, wait_s=5.0, clock=self.clock))

    def clock(self) -> float:
        return self.now

    def take_over(self) -> None:
        self.now += 120.0  # our 60 s lease ran out while we stalled
        self.takers.append(self.lock_type(self.loc.store(), "mem_wal_index", 60.0, wait_s=5.0,
                                          clock=self.clock).acquire())

    def release(self) -> None:
        for t in self.takers:
            t.release()


def test_a_lost_lease_fails_only_the_regions_not_yet_committed(local_location, monkeypatch):
    """
    two regions, one commit each | the first commits | our lease is taken over right after we lock for the
    second | the summary keeps the first region merged (its generation, no error) and reports only the
    second failed with the lease error: what the page's run line (failed_regions) and the alert
    (failure_reason) are made from. A rerun merges the second.
    """
    from memwal.jobs import failure_reason

    loc = local_location
    first, second = _regions_table(loc, 2, 1)
    lease = _Lease(monkeypatch, loc, on_acquire=lambda n: n == 2)
    try:
        summary = merge_table(loc.uri, config=MergeConfig(max_bytes_per_commit=1))
    finally:
        lease.release()
    assert lease.takers, "the lease was never taken over"
    out = summary.to_dict()
    by_region = {r["region_id"]: r for r in out["regions"]}
    assert out["failed_regions"] == [second], out["failed_regions"]
    assert by_region[first]["error"] is None and by_region[first]["generations"] == [1]
    assert by_region[first]["merged_generation_after"] == 1 and by_region[first]["commits"] == 1
    assert out["generations_merged"] == 1 and by_region[second]["generations"] == []
    assert "taken over" in by_region[second]["error"], by_region[second]["error"]
    reason = failure_reason(out)
    assert reason is not None and reason.startswith(f"1 of 2 region(s) failed: {second}: "), reason
    assert first not in reason
    assert dict(load_index(loc.uri).merged_generations) == {first: 1}
    monkeypatch.undo()
    rerun = merge_table(loc.uri)
    assert rerun.to_dict()["generations_merged"] == 1 and not rerun.failed_regions
    assert dict(load_index(loc.uri).merged_generations) == {first: 1, second: 1}


def test_a_lease_lost_between_marker_steps_reports_the_progress_the_index_records(local_location, monkeypatch):
    """
    two regions of two generations, in one commit: data with marker 1 for both, then a marker-only step
    to 2 | the lease is taken over before that step | both regions fail with the lease error, each merged
    up to 1 as the MemWAL index records (the step to 2 was not made); a rerun merges generation 2.
    """
    from memwal import merge_commit

    loc = local_location
    regions = _regions_table(loc, 2, 2)
    force_deletes_first(monkeypatch)  # so that step 2 is a marker-only commit (not the delete pass)
    lease = _Lease(monkeypatch, loc)
    real = merge_commit.fault_point

    def stall_before_the_step(name: str) -> None:
        real(name)
        if name == "merge.between_marker_steps" and not lease.takers:
            lease.take_over()

    monkeypatch.setattr(merge_commit, "fault_point", stall_before_the_step)
    try:
        summary = merge_table(loc.uri)
    finally:
        lease.release()
    assert lease.takers, "the commit made no marker-only step"
    assert summary.failed_regions == regions
    for r in summary.regions:
        assert "taken over" in r.error, r.error
        assert (r.merged_generation_before, r.merged_generation_after) == (0, 1), r
    assert dict(load_index(loc.uri).merged_generations) == dict.fromkeys(regions, 1)
    monkeypatch.undo()
    rerun = merge_table(loc.uri)
    assert not rerun.failed_regions and dict(load_index(loc.uri).merged_generations) == dict.fromkeys(regions, 2)


@pytest.mark.parametrize("per_commit, trims", [(2, 0), (1, 2)], ids=["one-commit", "three-commits"])
def test_freed_memory_goes_back_between_commits_not_after_the_last(local_location, monkeypatch, per_commit, trims):
    """memwal.memory.release_unused (a malloc_trim) runs before each commit that follows a landed one, so the
    footprint still follows one commit, and not after the run's last commit (issue 44: 5-7 ms of a merge)."""
    from support.merge_passes import passes_table

    calls = []
    monkeypatch.setattr(merge_mod, "release_unused", lambda: calls.append(1))
    loc = local_location
    gens = [([20], "g1", []), ([21], "g2", [3])] if per_commit == 2 else [([20], "g1", []), ([21], "g2", [3]),
                                                                         ([22], "g3", [])]
    region = passes_table(loc, gens)
    res = merge_region(loc.uri, None, region, MergeConfig(max_generations_per_commit=per_commit))
    assert res.generations == list(range(1, len(gens) + 1))
    assert len(calls) == trims
