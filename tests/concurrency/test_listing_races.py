"""Check-then-act reads of object listings, each raced deterministically: a storage hook runs the other
party's commit (or prune) at the exact moment between the read and the act. A race must be retried or
tolerated; only a real, confirmed inconsistency is an error."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest

from memwal import naming
from memwal.errors import CommitConflictError, CorruptFileError, FencedError, MissingGenerationError
from memwal.fencing import claim_region
from memwal.gc import GcConfig, gc_table
from memwal.lock import TableLock
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import latest_version, list_manifest_versions, load_latest_manifest
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.writer import RegionWriter

from support.maintenance import ONE_GEN_PER_FLUSH, merge_region
from support.storage_hooks import before_first
from support.tables import create_base, open_base, rows, view


def _region(loc, flushes: int = 3) -> str:
    """A MemWAL table with one region whose writer flushed `flushes` generations (versions 1..flushes+1)."""
    create_base(loc, ids=range(3))
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=ONE_GEN_PER_FLUSH) as w:
        for g in range(flushes):
            w.put(rows([100 + g], f"g{g + 1}"))
            w.flush()
    return region


def _is_manifest(region: str, version: int | None = None):
    if version is not None:
        return lambda path: path == naming.manifest_path(region, version)
    prefix = naming.manifest_dir(region)
    return lambda path: path == prefix or path.startswith(f"{prefix}/")


def test_claim_racing_another_claim_retries_instead_of_reporting_a_gap(local_location):
    """
    Writer B probes the latest version N; writer A claims N+1; B lists the manifest directory and sees
    N+1. Before the fix that read as "version N+1 is missing but N+1 exists" (CorruptFileError). It is a
    lost race: B must probe again and claim N+2.
    """
    loc = local_location
    region = _region(loc)
    store = loc.store()
    top = latest_version(store, region)
    epoch = load_latest_manifest(store, region).writer_epoch
    other = {}

    def writer_a_claims() -> None:
        other["a"] = claim_region(loc.store(), region)

    with before_first("list_files", _is_manifest(region), writer_a_claims) as fired:
        b = claim_region(store, region)
    assert fired, "the hook must run writer A's claim between B's probe and B's listing"
    assert other["a"].version == top + 1 and other["a"].writer_epoch == epoch + 1
    assert b.version == top + 2 and b.writer_epoch == epoch + 2, "the loser of the race claims the next version"


def test_flush_racing_a_claim_is_fenced_not_a_gap(local_location):
    """A writer's flush probes N; another writer claims N+1 before the flush lists: the flush is fenced."""
    loc = local_location
    region = _region(loc, flushes=1)
    w = RegionWriter(loc.uri, region, config=ONE_GEN_PER_FLUSH)
    w.put(rows([7], "w"))
    with before_first("list_files", _is_manifest(region), lambda: claim_region(loc.store(), region)), \
            pytest.raises(FencedError):
        w.flush()


def test_claim_while_gc_prunes_the_probed_versions_is_not_a_gap(local_location):
    """
    Versions 1..4, hint at 2 (hints are best effort). B probes: 2 exists; before B asks for 3, writer A
    claims version 5 and GC prunes versions 1..3 (oldest first). B's probe stops at 2 and its listing shows
    4..5: before the fix, a "gap" at 3. Version 2 is gone too, so it is a pruned prefix: probe again.
    """
    loc = local_location
    region = _region(loc)
    store = loc.store()
    assert list_manifest_versions(store, region) == [1, 2, 3, 4]
    store.put(naming.version_hint_path(region), json.dumps({"version": 2}).encode())

    def claim_then_gc() -> None:
        claim_region(loc.store(), region)
        gc_table(loc.uri, config=GcConfig(keep_manifest_versions=2))

    with before_first("head", _is_manifest(region, 3), claim_then_gc) as fired:
        b = claim_region(store, region)
    assert fired
    assert list_manifest_versions(store, region) == [4, 5, 6]
    assert b.version == 6 and b.writer_epoch == 3


def test_a_real_gap_is_still_refused(local_location):
    """Versions 1..4 with 3 deleted (not by GC: 2 is still there): the claim is refused, naming the region."""
    loc = local_location
    region = _region(loc)
    store = loc.store()
    store.delete(naming.manifest_path(region, 3))
    store.put(naming.version_hint_path(region), json.dumps({"version": 2}).encode())
    with pytest.raises(CorruptFileError, match=f"region {region}: manifest version 3 is missing but 4 exists"):
        claim_region(store, region)
    assert list_manifest_versions(store, region) == [1, 2, 4], "nothing may be written into the gap"


def test_snapshot_refresh_reading_a_manifest_that_gc_prunes(local_location):
    """
    Snapshot refresh probes a region's latest version N; before it reads N, a writer claims N+1 and GC
    (keeping one version) prunes N. Before the fix: RegionNotFoundError for a region that exists. The read
    must probe again and snapshot N+1.
    """
    loc = local_location
    region = _region(loc)
    top = latest_version(loc.store(), region)

    def claim_then_gc() -> None:
        claim_region(loc.store(), region)
        gc_table(loc.uri, config=GcConfig(keep_manifest_versions=1))

    with before_first("get", _is_manifest(region, top), claim_then_gc) as fired:
        summary = refresh_snapshot(loc.uri)
    assert fired and summary.num_regions == 1
    snap = read_snapshot(loc.uri).to_pylist()
    assert [r["writer_epoch"] for r in snap] == [2], "the snapshot holds the manifest written by the new claim"


def test_merge_racing_a_merge_and_gc_continues_from_what_is_merged(local_location):
    """
    Generations 1..4. Merger B reads merged_generations (0); merger A merges 1..2, Lance cleanup and GC
    prune generations 1..2 from the manifest; B reads the manifest: it starts at 3. Before the fix B
    refused "generation 1 is not in the region manifest". B must continue from 2 and merge 3..4 once.
    """
    loc = local_location
    region = _region(loc, flushes=4)
    expected = {i: (f"base{i}", i / 2) for i in range(3)} | {100 + g: (f"g{g + 1}{100 + g}", (100 + g) / 2)
                                                            for g in range(4)}

    def merge_and_gc() -> None:
        a = merge_region(loc.uri, None, region, up_to_generation=2)
        assert a.generations == [1, 2]
        open_base(loc).cleanup_old_versions(older_than=timedelta(0))
        gc_table(loc.uri, config=GcConfig(grace_period_s=0))
        assert all(fg.generation > 2 for fg in load_latest_manifest(loc.store(), region).flushed_generations)

    with before_first("get", _is_manifest(region), merge_and_gc) as fired:
        b = merge_table(loc.uri)
    assert fired
    assert not b.failed_regions, b.regions[0].error
    assert b.regions[0].generations == [3, 4] and b.regions[0].generations_merged_by_others == 2
    assert view(LsmReader(loc.uri).scan()) == expected, "every generation applied exactly once"
    assert view(open_base(loc).to_table()) == expected


def test_gc_racing_another_gc_skips_pruned_manifest_versions(local_location):
    """
    GC X lists manifest versions to find the WAL bound; GC Y prunes them before X reads the oldest.
    Before the fix X failed the region (RegionNotFoundError on a pruned version). It must skip it.
    """
    loc = local_location
    region = _region(loc)
    merge_table(loc.uri)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    expected = view(LsmReader(loc.uri).scan())

    with before_first("get", _is_manifest(region, 1),
                      lambda: gc_table(loc.uri, config=GcConfig(keep_manifest_versions=1))) as fired:
        x = gc_table(loc.uri, config=GcConfig(keep_manifest_versions=1))
    assert fired
    assert not any(r.error for r in x.regions), [r.error for r in x.regions]
    assert view(LsmReader(loc.uri).scan()) == expected


def test_lock_acquire_racing_a_renewal_does_not_take_over(local_location):
    """
    The newest lock object (seq 1) is held with an expired lease. B reads it and decides to take over;
    before B creates seq 2, the holder renews (creates seq 2). B's create must fail and B must see the
    renewed lease: it waits (here: gives up at once), never holds the lock beside the holder.
    """
    loc = local_location
    create_base(loc, ids=range(1))
    store = loc.store()
    holder = TableLock(store, "t", lease_s=60)
    store.put_if_not_exists(holder._path(1), json.dumps(
        {"owner": holder.owner, "state": "held", "expires_at": time.time() - 1}).encode())

    def holder_renews() -> None:
        store.put_if_not_exists(holder._path(2), json.dumps(
            {"owner": holder.owner, "state": "held", "expires_at": time.time() + 60}).encode())

    b = TableLock(store, "t", lease_s=60, wait_s=0)
    with before_first("put_if_not_exists", lambda p: p == holder._path(2), holder_renews) as fired, \
            pytest.raises(CommitConflictError, match="is held by"):
        b.acquire()
    assert fired and b.seq is None
    newest = json.loads(store.get(holder._path(2)))
    assert newest["owner"] == holder.owner and not store.exists(holder._path(3))


def _merge_to_2_and_collect(loc, region: str) -> None:
    """Another party: merge generations 1..2, Lance cleanup of old versions, GC of what is merged."""
    merge_region(loc.uri, None, region, up_to_generation=2)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    assert all(fg.generation > 2 for fg in load_latest_manifest(loc.store(), region).flushed_generations)


def test_reader_opening_while_generations_are_merged_and_collected_reopens(local_location):
    """
    Found by test_race_local on a loaded machine. The reader opens base version V (merged 0 for the region);
    before it reads the region manifest, generations 1..2 are merged, V is cleaned up and GC prunes 1..2.
    Before the fix the reader read V (without 1..2) and the manifest (without 1..2): rows of generations
    1..2 were silently missing and rows they deleted were back. A generation above V's merged generation
    that the manifest no longer lists means V is too old: the reader opens the newest version.
    """
    loc = local_location
    region = _region(loc)
    expected = view(LsmReader(loc.uri).scan())
    with before_first("get", _is_manifest(region), lambda: _merge_to_2_and_collect(loc, region)) as fired:
        reader = LsmReader(loc.uri)
    assert fired
    assert view(reader.scan()) == expected, "rows of generations merged and collected while opening were lost"


def test_reader_pinned_to_a_version_whose_generations_were_collected_says_so(local_location):
    """The same race for a reader pinned to version V: it cannot move on, so it names the region and generation."""
    loc = local_location
    region = _region(loc)
    version = open_base(loc).version
    with before_first("get", _is_manifest(region), lambda: _merge_to_2_and_collect(loc, region)), \
            pytest.raises(MissingGenerationError, match=f"generation 1 of region {region}.*read a newer version"):
        LsmReader(loc.uri, version=version)
