"""Searches while merge, index catch-up, snapshot and GC move the table on, forced deterministically: at each
of their fault points (hooked here to search instead of crash) and between catch-up's index commit and its
index_catchup record, a reader opened before the step (still open) and a reader opened there both return,
for vector and full-text search, every live row once at its newest version: never a stale or deleted row,
never a missing one (support.search_scenario's newest-wins model). Maintenance changes no row, so the model
holds at every point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import lance
import pytest

from memwal import catchup, gc, index_build, merge, merge_apply, merge_commit, naming, snapshot
from memwal import table as table_module
from memwal.catchup import DistributedBuild, catchup_table
from memwal.gc import GcConfig, gc_table
from memwal.merge import MergeConfig, merge_table
from memwal.reader import LsmReader
from memwal.snapshot import refresh_snapshot
from memwal.storage import lance_storage_options

from support.search_scenario import build, check_searches, generation_dirs
from support.storage_hooks import before_first

HOOKED = (merge, merge_commit, merge_apply, table_module, gc, snapshot, index_build)
COLLECT = GcConfig(keep_manifest_versions=1, grace_period_s=0)


@pytest.fixture
def lsm(local_location):
    regions, model = build(local_location)
    return local_location, regions, model


def _search_at_fault_points(monkeypatch, uri: str, model: dict, held: Sequence[LsmReader]) -> list[str]:
    """Every fault point of the maintenance modules searches the held readers and a fresh one; returns the
    list of points reached (filled as they are)."""
    hits: list[str] = []

    def hooked(name: str) -> None:
        hits.append(name)
        search_all(uri, model, held, f"at {name}")

    for module in HOOKED:
        monkeypatch.setattr(module, "fault_point", hooked)
    return hits


def search_all(uri: str, model: dict, held: Sequence[LsmReader], when: str) -> None:
    for i, reader in enumerate(held):
        check_searches(reader, model, f"reader {i} held open, {when}")
    check_searches(LsmReader(uri), model, f"reader opened {when}")


def _forget_old_versions(loc) -> None:
    lance.dataset(loc.uri, storage_options=lance_storage_options(loc.storage_options)).cleanup_old_versions(
        older_than=timedelta(0))


@pytest.mark.parametrize("apply", ["passes", "fragments"])
def test_searches_during_a_merge(lsm, monkeypatch, apply):
    """One generation per commit, both ways of applying a commit: at every step a reader opened before the
    merge (its base version and generations) and one opened at that step see the same rows."""
    loc, _, model = lsm
    held = [LsmReader(loc.uri)]
    hits = _search_at_fault_points(monkeypatch, loc.uri, model, held)
    assert not merge_table(loc.uri, config=MergeConfig(max_generations_per_commit=1, apply=apply)).failed_regions
    search_all(loc.uri, model, held, "after the merge")
    want = {"merge.before_commit", "merge.after_commit"} | (
        {"merge.between_passes"} if apply == "passes" else
        {"merge.apply_before_commit", "merge.between_update_and_marker"})
    assert want <= set(hits), f"the search never ran at {sorted(want - set(hits))}: {sorted(set(hits))}"


@pytest.mark.parametrize("distributed", [False, True])
def test_searches_during_catch_up(lsm, monkeypatch, distributed):
    """Merged, no index caught up (the gap): catch-up of both indexes, searched between its index commit and
    its index_catchup record, after the record, and (distributed) after the segment tasks and their commit."""
    loc, _, model = lsm
    assert not merge_table(loc.uri).failed_regions
    held = [LsmReader(loc.uri)]
    hits = _search_at_fault_points(monkeypatch, loc.uri, model, held)
    record = catchup.record_catchup

    def record_after_searching(table, results):
        hits.append("catchup.before_record")
        search_all(loc.uri, model, held, "with the index built, index_catchup not yet recorded")
        return record(table, results)

    monkeypatch.setattr(catchup, "record_catchup", record_after_searching)
    build_in_tasks = DistributedBuild(lambda fn, tasks: [fn(t) for t in tasks], groups=2, where="tasks",
                                      min_rows=0, min_group_rows=1) if distributed else None
    catchup_table(loc.uri, distributed=build_in_tasks)
    search_all(loc.uri, model, held, "after catch-up")
    want = {"catchup.before_record", "details.after_commit"} | (
        {"index_build.after_tasks", "index_build.after_commit"} if distributed else set())
    assert want <= set(hits), f"the search never ran at {sorted(want - set(hits))}: {sorted(set(hits))}"


def test_searches_during_snapshot_and_gc(lsm, monkeypatch):
    """A reader opened before the merge holds a base version GC must respect: its generations are kept and it
    stays exact. Once old versions are cleaned up, GC collects the merged, caught-up generations while a reader
    opened after catch-up is still open, at every step of the collection."""
    loc, regions, model = lsm
    before_merge = LsmReader(loc.uri)
    assert not merge_table(loc.uri).failed_regions
    catchup_table(loc.uri)
    after_catchup = LsmReader(loc.uri)
    hits = _search_at_fault_points(monkeypatch, loc.uri, model, [before_merge, after_catchup])
    refresh_snapshot(loc.uri, inline_threshold=0)  # an external snapshot file: its fault point is reached
    summary = gc_table(loc.uri, config=COLLECT)
    assert "generation" not in summary.to_dict()["deleted"], "a generation a retained version reads was collected"
    assert all(r.limited_by.startswith("retained table version") for r in summary.regions), summary.to_dict()
    assert [len(generation_dirs(loc, r)) for r in regions] == [2, 2]
    search_all(loc.uri, model, [before_merge, after_catchup], "after GC kept them for the retained version")
    assert "snapshot.after_external_write" in hits, sorted(set(hits))

    del before_merge  # its base version is about to be cleaned up: it can no longer be read
    hits = _search_at_fault_points(monkeypatch, loc.uri, model, [after_catchup])
    _forget_old_versions(loc)
    summary = gc_table(loc.uri, config=COLLECT)
    assert summary.to_dict()["deleted"]["generation"] == 4, summary.to_dict()
    search_all(loc.uri, model, [after_catchup], "after GC collected the generations")
    assert {"gc.after_manifest_prune", "gc.mid_delete"} <= set(hits), sorted(set(hits))


def _merge_catch_up_and_collect(loc) -> Callable[[], None]:
    def run() -> None:
        assert not merge_table(loc.uri).failed_regions
        catchup_table(loc.uri)
        _forget_old_versions(loc)
        assert gc_table(loc.uri, config=COLLECT).to_dict()["deleted"]["generation"] == 4

    return run


def test_a_reader_opening_while_its_generations_are_merged_and_collected_searches_exactly(lsm):
    """The reader has opened the base version (nothing merged) when, before it reads the first region manifest,
    every generation is merged, indexed and collected: it must not search the old base without them."""
    loc, regions, model = lsm
    region_dirs = tuple(naming.manifest_dir(r) for r in regions)
    with before_first("get", lambda path: path.startswith(region_dirs), _merge_catch_up_and_collect(loc)) as fired:
        reader = LsmReader(loc.uri)
    assert fired, "the hook never ran: the race was not forced"
    check_searches(reader, model, "reader opened across a merge, catch-up and GC")
