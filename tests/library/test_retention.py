"""Version retention (memwal.retention): the policy's verdict per version, the dry run, tags, the rebase
repair's window, and what GC may free afterwards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memwal import naming
from memwal.gc import gc_table
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.retention import RetentionConfig, plan_retention, repair_window, retain_versions
from memwal.table import MemWalTable

from support.maintenance import build_table
from support.tables import open_base, sorted_rows

NOW_ALL_OLD = RetentionConfig(older_than_s=0, keep_versions=1)


def _versions(loc) -> list[int]:
    return sorted(int(v["version"]) for v in open_base(loc).versions())


def test_dry_run_lists_versions_and_bytes_and_removes_nothing(location):
    loc = location
    build_table(loc, regions=2, generations=3)
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    before = _versions(loc)
    summary = retain_versions(MemWalTable(loc.uri, loc.storage_options),
                              RetentionConfig(older_than_s=0, keep_versions=1, dry_run=True))
    assert _versions(loc) == before, "a dry run must not remove a version"
    assert summary.versions_removed == before[:-1] and summary.retained_versions == [before[-1]]
    assert summary.bytes_removed > 0, "the merge rewrote data: the old versions hold bytes only they reference"
    out = summary.to_dict()
    assert out["removed_ranges"] == [[before[0], before[-2]]] and out["retained_ranges"] == [[before[-1]] * 2]
    assert out["num_versions_removed"] == len(before) - 1 and out["retained_by"] == {"latest": 1}
    assert [v["version"] for v in out["versions_sample"]] == before[-2::-1], "the sample: newest removed first"


def test_run_removes_old_versions_and_gc_then_frees_generations(location):
    """Base + 2 regions x 3 generations merged: before retention GC is held back by the retained
    versions; after it, GC removes every generation, and the LSM view is unchanged."""
    loc = location
    build_table(loc, regions=2, generations=3)
    merge_table(MemWalTable(loc.uri, loc.storage_options))
    expected = sorted_rows(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan())
    held = gc_table(MemWalTable(loc.uri, loc.storage_options))
    assert all(r.limited_by.startswith("retained table version") for r in held.regions)
    summary = retain_versions(MemWalTable(loc.uri, loc.storage_options), NOW_ALL_OLD)
    latest = _versions(loc)
    assert latest == [summary.oldest_retained_version] == summary.retained_versions
    assert summary.bytes_removed > 0 and len(summary.versions_removed) == summary.versions_before - 1
    freed = gc_table(MemWalTable(loc.uri, loc.storage_options))
    assert freed.to_dict()["deleted"].get("generation") == 6, "retention must let GC free the merged generations"
    assert sorted_rows(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan()) == expected


def test_keep_versions_and_age_both_protect(local_location):
    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    versions = _versions(loc)
    kept_newest = retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=3))
    assert kept_newest.retained_versions == versions[-3:], "the newest keep_versions versions stay"
    young = retain_versions(loc.uri, RetentionConfig(older_than_s=3600, keep_versions=1))
    assert young.versions_removed == [] and young.retained_versions == versions[-3:], (
        "versions younger than older_than_s stay: the time travel the policy promises")


def test_tagged_versions_are_kept_without_error(local_location):
    loc = local_location
    build_table(loc, regions=1, generations=2)
    open_base(loc).tags.create("audit", 2)
    merge_table(loc.uri)
    summary = retain_versions(loc.uri, NOW_ALL_OLD)
    assert 2 in _versions(loc) and 2 in summary.retained_versions, "a tagged version is always kept"
    entry = next(v for v in summary.versions if v.version == 2)
    assert entry.tags == ["audit"] and not entry.remove and entry.reason.startswith("tagged")
    assert open_base(loc, version=2).count_rows() == 10, "a reader pinned to the tag still reads it"


def test_lsm_reads_at_every_retained_version_stay_exact(local_location):
    """After retention and GC, a time-travel LSM read at each retained version equals the same read
    before retention: GC follows the retained versions' merged_generations."""
    loc = local_location
    build_table(loc, regions=2, generations=3)
    merge_table(loc.uri, config=None)
    before = {v: sorted_rows(LsmReader(loc.uri, version=v).scan()) for v in _versions(loc)}
    summary = retain_versions(loc.uri, RetentionConfig(older_than_s=0, keep_versions=2))
    gc_table(loc.uri)
    assert len(summary.retained_versions) == 2
    for v in summary.retained_versions:
        assert sorted_rows(LsmReader(loc.uri, version=v).scan()) == before[v], f"LSM read at version {v} changed"


def test_repair_window_versions_are_kept(local_location, monkeypatch):
    """A MemWAL index rewrite rebased over versions r+1..v-1: the repair reads them, so retention keeps them
    whatever the policy says."""
    import memwal.retention as retention

    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    versions = _versions(loc)
    window = set(versions[:-1])
    monkeypatch.setattr(retention, "repair_window", lambda ds: window)
    plan = plan_retention(loc.uri, NOW_ALL_OLD, now=datetime.now(UTC) + timedelta(days=1))
    assert set(plan.retained) == window | {versions[-1]}
    assert all("rebase repair" in v.reason for v in plan.versions if v.version in window)


def test_repair_window_of_a_table_without_rebased_rewrites_is_empty(local_location):
    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    assert repair_window(open_base(loc)) == set()


def test_a_rebased_snapshot_rewrite_protects_the_version_it_was_rebased_over(local_location, monkeypatch):
    """A snapshot refresh reads the index, a merge by another tool commits (version m), the refresh's
    details commit lands rebased over it: retention must keep m, which the rebase repair reads."""
    import memwal.mem_wal_index as mwi
    from memwal.snapshot import refresh_snapshot

    from support.maintenance import merge_without_our_lock

    loc = local_location
    (region,) = build_table(loc, regions=1, generations=2)
    real_op = mwi.create_index_op
    merged: list[int] = []

    def merge_first(*args, **kwargs):
        if not merged:
            merge_without_our_lock(loc.uri, None, region)
            merged.append(open_base(loc).version)
        return real_op(*args, **kwargs)

    monkeypatch.setattr(mwi, "create_index_op", merge_first)
    refresh_snapshot(loc.uri)
    monkeypatch.undo()
    assert merged[0] in repair_window(open_base(loc))
    summary = retain_versions(loc.uri, NOW_ALL_OLD)
    assert merged[0] in summary.retained_versions, "the version the repair reads must survive retention"
    assert mwi.load_index(loc.uri).merged_generations[region] == 2


def test_disabled_policy_removes_nothing(local_location):
    loc = local_location
    build_table(loc, regions=1, generations=1)
    before = _versions(loc)
    summary = retain_versions(loc.uri, RetentionConfig(enabled=False, older_than_s=0, keep_versions=1))
    assert _versions(loc) == before and summary.versions_removed == [] and not summary.enabled


def test_bad_policy_is_refused_with_the_key_named():
    with pytest.raises(ValueError, match="keep_versions"):
        RetentionConfig(keep_versions=0)
    with pytest.raises(ValueError, match="older_than_s"):
        RetentionConfig(older_than_s=-1)


def test_retention_never_touches_mem_wal(local_location):
    """Nothing under _mem_wal/ changes but the MemWAL index lock's own objects (a real run holds it)."""
    from memwal.lock import LOCK_DIR

    loc = local_location
    build_table(loc, regions=1, generations=2)
    merge_table(loc.uri)
    store = loc.store()

    def mem_wal() -> list[str]:
        return sorted(m.path for m in store.list(naming.MEM_WAL_DIR) if not m.path.startswith(LOCK_DIR + "/"))

    before = mem_wal()
    retain_versions(loc.uri, NOW_ALL_OLD)
    assert mem_wal() == before
