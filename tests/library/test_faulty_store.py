"""The MemWAL paths against a misbehaving S3 (issue 42): each test forces one fault on one request through the
fault proxy in front of moto (tests/support/fault_proxy.py), for our object store and Lance's alike, and checks
the path recovers exactly (or fails with one clear error). docs/safety.md tabulates what each path does."""

from __future__ import annotations

import logging
import re
import uuid

import pyarrow as pa
import pytest

from memwal import naming, wal
from memwal.errors import ObjectStoreError
from memwal.lock import TableLock
from memwal.region_manifest import commit_manifest, latest_version, load_latest_manifest, load_manifest
from memwal.storage import ObjectStore
from memwal.writer import RegionWriter, WriterConfig

from support.fault_proxy import FaultProxy
from support.locations import Location, new_bucket, s3_options
from support.maintenance import merge_region
from support.tables import create_base, open_base, rows, view

NEVER = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)
MANIFEST = r"/manifest/[01]+\.binpb$"
LOCK = r"/_locks/"
WAL = r"/wal/[01]+\.arrow$"


@pytest.fixture
def proxy(s3_endpoint):
    with FaultProxy(s3_endpoint) as p:
        yield p


@pytest.fixture
def faulty(proxy, s3_endpoint) -> Location:
    """A table location whose every request (ours and Lance's) goes through the fault proxy."""
    return Location("s3", f"s3://{new_bucket(s3_endpoint)}/table", proxy.options(s3_options(s3_endpoint)))


def _table(loc: Location) -> None:
    create_base(loc, ids=range(3))
    open_base(loc).initialize_mem_wal(unsharded=True)


# --- region manifests: the flush's commit, the claim -------------------------------------------------------


def test_a_flush_whose_manifest_create_answer_is_lost_commits_once(faulty, proxy):
    """The issue's wedge: manifest version 3 lands, its answer is lost, the retry gets 412. Guessing 'another
    writer won' re-applied the flush as version 4, listing generation 2 twice ([1, 2, 2, 3]), and every merge
    of the region then refused it. Read back, the 412 is our own create: generations [1, 2, 3]."""
    _table(faulty)
    region = str(uuid.uuid4())
    store = faulty.store()
    with RegionWriter(faulty.uri, region, storage_options=faulty.storage_options, config=NEVER) as w:
        for g in (1, 2, 3):
            w.put(rows([100 + g], f"g{g}"))
            if g == 2:
                proxy.plan("lost", method="PUT", key=MANIFEST, conditional=True)
            w.flush()
    assert proxy.injected["lost"] == 1 and proxy.pending() == 0
    m = load_latest_manifest(store, region)
    assert [fg.generation for fg in m.flushed_generations] == [1, 2, 3]
    assert m.version == 4 and m.current_generation == 4, "one manifest version per flush (claim + 3 flushes)"
    merge_region(faulty.uri, faulty.storage_options, region)
    assert view(open_base(faulty).to_table()) == view(rows([0, 1, 2], "base")) | view(
        pa.concat_tables([rows([101], "g1"), rows([102], "g2"), rows([103], "g3")]))


def test_a_claim_whose_manifest_create_answer_is_lost_claims_once(faulty, proxy):
    """A claim lands, its answer is lost: the claimer is the writer of the epoch it created (not a second
    claim over its own, which skipped an epoch and a manifest version)."""
    _table(faulty)
    region = str(uuid.uuid4())
    RegionWriter(faulty.uri, region, storage_options=faulty.storage_options, config=NEVER).close()
    proxy.plan("lost", method="PUT", key=MANIFEST, conditional=True)
    w = RegionWriter(faulty.uri, region, storage_options=faulty.storage_options, config=NEVER)
    w.close()
    assert proxy.injected["lost"] == 1
    assert w.writer_epoch == 2 and latest_version(faulty.store(), region) == 2


def test_two_claimers_proposing_the_same_fields_never_share_an_epoch(s3_location):
    """Read-back must not mistake another claimer's create for ours: both propose version 2 with epoch 2
    (identical fields); the commit token makes their bytes differ, so the loser claims again (epoch 3)."""
    from memwal import fencing

    from support.storage_hooks import before_first

    store = s3_location.store()
    region = str(uuid.uuid4())
    first = fencing.claim_region(store, region)
    other: list = []
    v2 = naming.manifest_path(region, 2)
    def other_claims() -> None:
        other.append(fencing.claim_region(store, region))

    with before_first("put_if_not_exists", lambda p: p == v2, other_claims):
        ours = fencing.claim_region(store, region)
    assert first.writer_epoch == 1 and other[0].writer_epoch == 2
    assert ours.writer_epoch == 3 and ours.version == 3, "the loser of version 2 must not believe it won"


def test_a_manifest_listing_a_generation_twice_is_refused_before_it_is_written(s3_location):
    from memwal.errors import MemWalError
    from memwal.region_manifest import FlushedGeneration, RegionManifest

    store = s3_location.store()
    region = str(uuid.uuid4())
    gens = (FlushedGeneration(1, "a_gen_1"), FlushedGeneration(2, "b_gen_2"), FlushedGeneration(2, "c_gen_2"))
    with pytest.raises(MemWalError, match=r"list a flushed generation twice \(\[1, 2, 2\]\)"):
        commit_manifest(store, RegionManifest(region, 1, writer_epoch=1, flushed_generations=gens))
    assert latest_version(store, region) == 0


def test_commit_tokens_make_each_commit_unique_and_are_not_copied(s3_location):
    store = s3_location.store()
    region = str(uuid.uuid4())
    from memwal.region_manifest import RegionManifest

    m1 = commit_manifest(store, RegionManifest(region, 1, writer_epoch=1))
    m2 = commit_manifest(store, m1.next_version())
    raw1, raw2 = store.get(naming.manifest_path(region, 1)), store.get(naming.manifest_path(region, 2))
    from memwal.region_manifest import COMMIT_TOKEN_FIELD

    tag = bytes([(COMMIT_TOKEN_FIELD << 3 | 2) & 0x7F | 0x80, (COMMIT_TOKEN_FIELD << 3 | 2) >> 7, 16])

    def token(raw: bytes) -> bytes:
        assert raw.count(tag) == 1, "one commit token per version"
        return raw[raw.index(tag) + len(tag):][:16]

    assert token(raw1) != token(raw2) and token(raw1) not in raw2, "version 2 carries its own token only"
    assert load_manifest(store, region, 2) == m2, "the token changes no field"


# --- WAL entries -------------------------------------------------------------------------------------------


def test_a_wal_entry_whose_create_answer_is_lost_is_written_once(faulty, proxy):
    """The entry lands, its answer is lost, the retry gets 412: read back, it is ours. (Guessing, the writer
    absorbed its own entry as another's and wrote the same rows again at the next position.)"""
    _table(faulty)
    region = str(uuid.uuid4())
    w = RegionWriter(faulty.uri, region, storage_options=faulty.storage_options, config=NEVER)
    proxy.plan("lost", method="PUT", key=WAL, conditional=True)
    w.put(rows([7]))
    w.put(rows([8]))
    w.close()
    assert proxy.injected["lost"] == 1
    assert w.stats.absorbed_entries == 0
    assert wal.list_wal_positions(faulty.store(), region) == [1, 2], "one entry per put"


@pytest.mark.parametrize("kind", ["503", "500", "reset"])
def test_a_wal_entry_survives_a_transient_fault(faulty, proxy, kind):
    _table(faulty)
    region = str(uuid.uuid4())
    w = RegionWriter(faulty.uri, region, storage_options=faulty.storage_options, config=NEVER)
    proxy.plan(kind, method="PUT", key=WAL, times=2)
    w.put(rows([7]))
    w.close()
    assert proxy.injected[kind] == 2
    assert [e.table.column("id").to_pylist() for e in wal.scan_wal(faulty.store(), region, 0)] == [[7]]


# --- the MemWAL index lock ---------------------------------------------------------------------------------


def test_a_lock_whose_create_answer_is_lost_is_ours_at_once(faulty, proxy):
    """The lock object lands, its answer is lost, the retry gets 412: read back it is ours (token: the
    owner and lease in it), so the lock is held at once, not after waiting out our own lease."""
    store = faulty.store()
    proxy.plan("lost", method="PUT", key=LOCK, conditional=True)
    lock = TableLock(store, "t", lease_s=600, wait_s=0).acquire()
    try:
        assert proxy.injected["lost"] == 1 and lock.seq == 1
        lock.check()
    finally:
        lock.release()


def test_a_lost_release_answer_is_a_release(faulty, proxy, caplog):
    store = faulty.store()
    lock = TableLock(store, "t", lease_s=600, wait_s=0).acquire()
    proxy.plan("lost", method="PUT", key=LOCK, conditional=True)
    with caplog.at_level(logging.WARNING, logger="memwal.lock"):
        lock.release()
    assert proxy.injected["lost"] == 1
    assert not [r for r in caplog.records if "taken over" in r.getMessage()], "our own release is no takeover"
    assert TableLock(store, "t", lease_s=600, wait_s=0).acquire().seq == 3


def test_a_lost_renew_answer_keeps_the_lease(faulty, proxy):
    store = faulty.store()
    lock = TableLock(store, "t", lease_s=600, wait_s=0).acquire()
    try:
        proxy.plan("lost", method="PUT", key=LOCK, conditional=True)
        assert lock.renew() and lock.seq == 2
        lock.check()
    finally:
        lock.release()


# --- deletes, listings, and a store that keeps failing ------------------------------------------------------


def test_a_delete_whose_answer_is_lost_is_done(faulty, proxy):
    store = faulty.store()
    store.put("x/a.bin", b"1")
    proxy.plan("lost", method="DELETE")
    store.delete("x/a.bin")
    assert proxy.injected["lost"] == 1 and not store.exists("x/a.bin")


def test_listings_survive_503_bursts(faulty, proxy):
    store = faulty.store()
    for i in range(3):
        store.put(f"x/{i}.bin", b"1")
    proxy.plan("503", method="LIST", times=3)
    assert sorted(m.path for m in store.list("x")) == [f"x/{i}.bin" for i in range(3)]
    assert proxy.injected["503"] == 3


def test_a_store_that_keeps_failing_gives_one_error_naming_table_operation_object_and_fault(proxy, s3_endpoint):
    opts = {**proxy.options(s3_options(s3_endpoint)), "client_max_retries": "2", "client_retry_timeout": "10"}
    store = ObjectStore(f"s3://{new_bucket(s3_endpoint)}/table", opts)
    proxy.plan("503", method="GET", times=3)
    with pytest.raises(ObjectStoreError) as caught:
        store.get("_mem_wal/r/manifest/x.binpb")
    exc = caught.value
    assert (exc.operation, exc.path, exc.table_uri) == ("get", "_mem_wal/r/manifest/x.binpb", store.uri)
    text = str(exc)
    assert text.startswith(f"object store get of _mem_wal/r/manifest/x.binpb in table {store.uri} failed: ")
    assert "503" in text and "SlowDown" in text and "after 2 retries" in text and "\n" not in text
    assert proxy.injected["503"] == 3


def test_a_create_that_keeps_failing_but_landed_is_ours(proxy, s3_endpoint):
    """Every answer of a create lost, retries exhausted: the object read back holds our bytes, so it landed."""
    opts = {**proxy.options(s3_options(s3_endpoint)), "client_max_retries": "1", "client_retry_timeout": "10"}
    store = ObjectStore(f"s3://{new_bucket(s3_endpoint)}/table", opts)
    proxy.plan("lost", method="PUT", key="a.bin", times=1)
    proxy.plan("503", method="PUT", key="a.bin", times=1)
    store.put_if_not_exists("a.bin", b"ours")
    assert store.get("a.bin") == b"ours"
    proxy.plan("503", method="PUT", key="b.bin", times=2)
    with pytest.raises(ObjectStoreError, match=r"object store put of b\.bin"):
        store.put_if_not_exists("b.bin", b"ours")
    assert not store.exists("b.bin")


def test_retry_options_are_numbers(s3_endpoint):
    from memwal.errors import BadInputError

    with pytest.raises(BadInputError, match="client_max_retries='many' is not a number"):
        ObjectStore("s3://b/t", {**s3_options(s3_endpoint), "client_max_retries": "many"})


# --- merge and GC ------------------------------------------------------------------------------------------


def _merged(loc: Location) -> dict[str, int]:
    from memwal.mem_wal_index import load_index

    return dict(load_index(loc.uri, loc.storage_options).details.merged_generations)


@pytest.mark.parametrize("kind", ["lost", "503"])
def test_a_merge_whose_lance_commit_fails_once_merges_exactly_once(faulty, proxy, kind):
    """The merge's Lance commit (the base table's `_versions/` create) lands with its answer lost, or fails
    once: Lance's retry meets its own commit (a conflict), our pass reopens, sees the marker already moved,
    and replans from what is merged: nothing applied twice, progress exact."""
    from memwal.reader import LsmReader
    from memwal.table import MemWalTable

    from support.maintenance import build_table

    (a,) = build_table(faulty, regions=1, generations=3)
    expected = view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan())
    proxy.plan(kind, method="PUT", key=r"^table/_versions/")
    merge_region(faulty.uri, faulty.storage_options, a)
    assert proxy.injected[kind] == 1
    assert _merged(faulty) == {a: 3}
    assert view(open_base(faulty).to_table()) == expected


def test_gc_through_lost_deletes_and_503_listings_removes_exactly_what_it_planned(faulty, proxy):
    from datetime import timedelta

    from memwal.gc import GcConfig, gc_table
    from memwal.merge import merge_table
    from memwal.reader import LsmReader
    from memwal.region_manifest import list_manifest_versions
    from memwal.table import MemWalTable

    from support.maintenance import build_table

    (a,) = build_table(faulty, regions=1, generations=3)
    merge_table(MemWalTable(faulty.uri, faulty.storage_options))
    open_base(faulty).cleanup_old_versions(older_than=timedelta(0))
    expected = view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan())
    proxy.plan("503", method="LIST", times=2)
    proxy.plan("lost", method="PUT", key=MANIFEST, conditional=True)  # the prune's manifest commit
    proxy.plan("lost", method="DELETE", times=2)
    summary = gc_table(MemWalTable(faulty.uri, faulty.storage_options), config=GcConfig(keep_manifest_versions=2))
    assert proxy.pending() == 0 and proxy.injected == {"503": 2, "lost": 3}
    assert not [r for r in summary.regions if r.error], summary.to_dict()
    store = faulty.store()
    m = load_latest_manifest(store, a)
    assert m.flushed_generations == () and len(list_manifest_versions(store, a)) == 2
    assert not [d for d in store.list_dirs(naming.region_dir(a)) if "_gen_" in d]
    assert view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan()) == expected


# --- slow requests stretching the lease; the snapshot -------------------------------------------------------


class _Clock:
    """The lock's wall clock, moved by the test (at a planned stall), not by time passing."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_check_stalled_past_the_lease_while_another_job_takes_over_stops_the_commit(faulty, proxy):
    """The lease check's listing stalls; meanwhile the lease runs out and another job takes the lock (the
    planned stall's action): the check sees the takeover and refuses (LeaseLostError), as does the next renew."""
    from memwal.errors import LeaseLostError

    store, clock = faulty.store(), _Clock()
    holder = TableLock(store, "t", lease_s=30, clock=clock).acquire()
    taker: list[TableLock] = []

    def lease_runs_out_and_another_job_takes_over() -> None:
        clock.now += 31
        taker.append(TableLock(store, "t", lease_s=30, wait_s=0, clock=clock).acquire())

    proxy.plan("stall", method="LIST", key=LOCK, action=lease_runs_out_and_another_job_takes_over)
    with pytest.raises(LeaseLostError) as caught:
        holder.check()
    assert taker and taker[0].seq == 2
    assert f"was taken over (newest lock object: {taker[0].owner})" in str(caught.value)
    assert not holder.renew(), "the taker's object is not ours: the renew loses"
    taker[0].release()


def test_a_renew_stalled_past_the_lease_loses_to_the_taker(faulty, proxy):
    store, clock = faulty.store(), _Clock()
    holder = TableLock(store, "t", lease_s=30, clock=clock).acquire()
    taker: list[TableLock] = []

    def takeover() -> None:
        clock.now += 31
        taker.append(TableLock(store, "t", lease_s=30, wait_s=0, clock=clock).acquire())

    proxy.plan("stall", method="PUT", key=LOCK, action=takeover)
    assert not holder.renew(), "seq 2 is the taker's (read back: not our bytes), so our lease is lost"
    assert taker[0].seq == 2
    taker[0].check()
    taker[0].release()


def test_a_snapshot_refresh_through_lost_answers_and_503s_commits_every_region(faulty, proxy):
    from memwal.snapshot import read_snapshot, refresh_snapshot
    from memwal.table import MemWalTable

    from support.maintenance import build_table

    regions = build_table(faulty, regions=2, generations=1)
    proxy.plan("503", method="GET", key=MANIFEST, times=2)
    proxy.plan("lost", method="PUT", key=r"^table/_versions/")
    refresh_snapshot(MemWalTable(faulty.uri, faulty.storage_options))
    assert proxy.pending() == 0
    snap = read_snapshot(MemWalTable(faulty.uri, faulty.storage_options))
    assert snap is not None and snap.num_rows == 2
    assert sorted(str(uuid.UUID(bytes=b)) for b in snap.column("region_id").to_pylist()) == sorted(regions)


def test_a_flush_left_in_doubt_never_lists_a_generation_twice_and_a_reopened_writer_goes_on(proxy, s3_endpoint):
    """The manifest create lands, its answer is lost, the retry fails too and so does the read-back: the flush
    cannot know (ObjectStoreError). Flushing the same MemTable again must not commit its generation a second
    time (the region would be wedged for merges): refused with a clear error. A reopened writer claims, replays
    only what the landed version left unflushed, and goes on."""
    from memwal.errors import MemWalError

    loc = Location("s3", f"s3://{new_bucket(s3_endpoint)}/table",
                   {**proxy.options(s3_options(s3_endpoint)), "client_max_retries": "1", "client_retry_timeout": "10"})
    _table(loc)
    region = str(uuid.uuid4())
    w = RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER)
    w.put(rows([5], "a"))
    proxy.plan("lost", method="PUT", key=MANIFEST, conditional=True)
    proxy.plan("503", method="PUT", key=MANIFEST, conditional=True,  # the retry; then the read-back fails too
               action=lambda: proxy.plan("503", method="GET", key=MANIFEST, times=2))
    with pytest.raises(ObjectStoreError, match=r"object store put of .*/manifest/"):
        w.flush()
    assert proxy.pending() == 0
    with pytest.raises(MemWalError, match=r"would list a flushed generation twice \(\[1, 1\]\)"):
        w.flush()
    store = loc.store()
    assert [fg.generation for fg in load_latest_manifest(store, region).flushed_generations] == [1]
    w2 = RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER)
    assert w2.stats.replayed_entries == 0, "the landed flush covered the entry"
    w2.put(rows([6], "b"))
    w2.flush()
    w2.close()
    assert [fg.generation for fg in load_latest_manifest(store, region).flushed_generations] == [1, 2]
    merge_region(loc.uri, loc.storage_options, region)
    assert {5, 6} <= set(view(open_base(loc).to_table()))


def test_a_renew_left_in_doubt_is_adopted_by_the_next_beat(proxy, s3_endpoint):
    """A renew's create lands, its answer is lost, its retry and the read-back fail: the beat logs and keeps
    its sequence. The next beat meets that object: ours (our owner id), so it steps past it and renews,
    instead of reading its own object as a takeover and stopping the heartbeat."""
    opts = {**proxy.options(s3_options(s3_endpoint)), "client_max_retries": "1", "client_retry_timeout": "10"}
    store = ObjectStore(f"s3://{new_bucket(s3_endpoint)}/table", opts)
    lock = TableLock(store, "t", lease_s=600, wait_s=0).acquire()
    try:
        proxy.plan("lost", method="PUT", key=LOCK, conditional=True)
        proxy.plan("503", method="PUT", key=LOCK, conditional=True,
                   action=lambda: proxy.plan("503", method="GET", key=LOCK, times=2))
        assert lock.renew() and lock.seq == 1, "in doubt: logged, the next beat retries"
        assert proxy.pending() == 0
        assert lock.renew(), "seq 2 is our own in-doubt renew, not a takeover"
        assert lock.seq == 3
        lock.check()
    finally:
        lock.release()
    assert TableLock(store, "t", lease_s=600, wait_s=0).acquire().seq == 5


def test_retention_through_lost_delete_answers_and_503_listings_removes_exactly_the_plan(faulty, proxy):
    """Lance's cleanup deletes old versions' files: a delete whose answer is lost is retried and finds the
    object gone (success), listings that 503 are retried; the LSM view and the kept versions are exact."""
    from memwal.maintenance_config import RetentionConfig
    from memwal.merge import merge_table
    from memwal.reader import LsmReader
    from memwal.retention import retain_versions
    from memwal.table import MemWalTable

    from support.maintenance import build_table

    build_table(faulty, regions=1, generations=2)
    merge_table(MemWalTable(faulty.uri, faulty.storage_options))
    expected = view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan())
    newest = open_base(faulty).version
    proxy.plan("lost", method="DELETE", key=r"^table/(_transactions|_versions|data)/", times=2)  # Lance's cleanup
    proxy.plan("503", method="LIST", times=2)
    summary = retain_versions(MemWalTable(faulty.uri, faulty.storage_options),
                              RetentionConfig(older_than_s=0, keep_versions=1))
    assert proxy.pending() == 0
    assert summary.versions_removed and summary.retained_versions == [newest]
    assert [v["version"] for v in open_base(faulty).versions()] == [newest]
    assert view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan()) == expected


def test_catchup_through_lost_commit_answers_records_exactly(faulty, proxy):
    """Catch-up's index optimise and its record of index_catchup are Lance commits: their answers lost, Lance
    recognises its own commits; the index covers every fragment and the record is exact."""
    from memwal.catchup import catchup_table
    from memwal.mem_wal_index import load_index
    from memwal.merge import merge_table
    from memwal.table import MemWalTable

    from support.maintenance import build_table

    (a,) = build_table(faulty, regions=1, generations=3)
    open_base(faulty).create_scalar_index("name", "BTREE", name="name_idx")
    merge_table(MemWalTable(faulty.uri, faulty.storage_options))
    proxy.plan("lost", method="PUT", key=r"^table/_versions/", times=2)
    summary = catchup_table(MemWalTable(faulty.uri, faulty.storage_options))
    assert proxy.pending() == 0
    assert [(i.index_name, i.covered, i.error) for i in summary.indexes] == [("name_idx", True, None)]
    assert load_index(faulty.uri, faulty.storage_options).details.index_catchup["name_idx"] == {a: 3}
    assert open_base(faulty).stats.index_stats("name_idx")["num_unindexed_rows"] == 0


def test_a_create_that_hangs_past_the_client_timeout_and_lands_later_is_recognised_on_retry(proxy, s3_endpoint):
    """A create hangs at the store past the client's timeout (PUTs are not retried on a timeout): in doubt,
    ObjectStoreError. It lands afterwards. The caller's retry of the same create meets 412 and reads back its
    own bytes: done; a different create there is a lost race."""
    import threading

    from memwal.errors import AlreadyExistsError

    opts = {**proxy.options(s3_options(s3_endpoint)), "timeout": "1s", "client_max_retries": "0"}
    store = ObjectStore(f"s3://{new_bucket(s3_endpoint)}/table", opts)
    release, forwarded = threading.Event(), threading.Event()
    proxy.plan("stall", method="PUT", key="m.bin", action=lambda: release.wait(30))
    proxy.plan("503", method="GET", key="m.bin", action=release.set)  # the read-back, while the PUT still hangs
    with pytest.raises(ObjectStoreError, match=r"object store put of m\.bin"):
        store.put_if_not_exists("m.bin", b"ours")
    direct = ObjectStore(store.uri, s3_options(s3_endpoint))
    for _ in range(300):  # the held PUT goes on once released; wait for it to land (no ordering by sleep)
        if direct.exists("m.bin"):
            forwarded.set()
            break
        release.wait(0.1)
    assert forwarded.is_set(), "the hung create landed after the client gave up"
    store.put_if_not_exists("m.bin", b"ours")
    with pytest.raises(AlreadyExistsError):
        store.put_if_not_exists("m.bin", b"theirs")


def test_compaction_through_lost_answers_keeps_progress_and_the_view(faulty, proxy):
    """A compaction round takes the lock (its create's answer lost) and commits through Lance (its answer
    lost): the round commits once, merged_generations and the LSM view are as before."""
    import lance

    from memwal.compaction import compact_table
    from memwal.maintenance_config import CompactionConfig
    from memwal.merge import merge_table
    from memwal.reader import LsmReader
    from memwal.table import MemWalTable

    from support.maintenance import write_generations

    lance.write_dataset(rows(range(8), "base"), faulty.uri, max_rows_per_file=2, storage_options=faulty.storage_options)
    open_base(faulty).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    write_generations(faulty, region, [([1, 20], "g1", [3]), ([21], "g2", [])])
    merge_table(MemWalTable(faulty.uri, faulty.storage_options))
    expected = view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan())
    before = _merged(faulty)
    proxy.plan("lost", method="PUT", key=LOCK, conditional=True)
    proxy.plan("lost", method="PUT", key=r"^table/_versions/")
    summary = compact_table(MemWalTable(faulty.uri, faulty.storage_options),
                            CompactionConfig(force=True, target_rows_per_fragment=100))
    assert proxy.pending() == 0
    assert summary.tasks_committed >= 1 and summary.health_after["fragments"] == 1, summary.to_dict()
    assert _merged(faulty) == before == {region: 2}
    assert view(LsmReader(MemWalTable(faulty.uri, faulty.storage_options)).scan()) == expected


def test_a_merge_whose_store_fails_after_its_first_commit_reports_the_regions_own_error(proxy, s3_endpoint):
    """From the merge's first Lance commit on, the store answers 503 to everything: the region fails with its
    own one-line error (naming the table, the operation, the object and the fault) and the summary is kept.
    Before, the merge's closing read of the table version raised Lance's error of that read instead, losing
    the summary (what committed, each region's error), so the Airflow task reported the wrong request."""
    from memwal.merge import MergeConfig, merge_table
    from memwal.reader import LsmReader
    from memwal.table import MemWalTable

    from support.maintenance import build_table

    loc = Location("s3", f"s3://{new_bucket(s3_endpoint)}/table",
                   {**proxy.options(s3_options(s3_endpoint)), "client_max_retries": "1", "client_retry_timeout": "10"})
    (a,) = build_table(loc, regions=1, generations=3)
    expected = view(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan())
    proxy.plan("stall", method="PUT", key=r"^table/_versions/",
               action=lambda: proxy.plan("503", key=r"^table/", times=10**9))
    summary = merge_table(MemWalTable(loc.uri, loc.storage_options), config=MergeConfig(max_generations_per_commit=1))
    assert proxy.injected["stall"] == 1 and proxy.injected["503"] > 0
    (region,) = summary.regions
    assert summary.failed_regions == [a] and "\n" not in region.error, summary
    assert re.search(rf"object store (get|head|list|put|delete) of \S+ in table {re.escape(loc.uri)} failed: "
                     r"|Error performing (GET|HEAD|PUT|POST|DELETE) http://\S+/table/", region.error), region.error
    assert "503 Service Unavailable" in region.error and "SlowDown" in region.error, region.error
    direct = Location("s3", loc.uri, s3_options(s3_endpoint))
    assert view(LsmReader(MemWalTable(direct.uri, direct.storage_options)).scan()) == expected, "nothing half-done"
