"""GC keeps every generation in an index's gap (merged, but above that index's index_catchup) until the index
catches up, as the spec's GC rule requires; searched throughout: vector and full-text search stay exact (equal
to a brute-force newest-wins model) while the gap is kept, and after catch-up, snapshot and GC remove it."""

from __future__ import annotations

from datetime import timedelta

import lance

from memwal.catchup import catchup_table
from memwal.gc import GcConfig, gc_table
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.snapshot import refresh_snapshot
from memwal.storage import lance_storage_options
from memwal.table import MemWalTable

from support.search_scenario import build, check_searches, generation_dirs

COLLECT = GcConfig(keep_manifest_versions=1, grace_period_s=0)


def _forget_old_versions(loc) -> None:
    """Only the latest base version is retained: time travel no longer holds any generation back."""
    lance.dataset(loc.uri, storage_options=lance_storage_options(loc.storage_options)).cleanup_old_versions(
        older_than=timedelta(0))


def test_gc_keeps_the_gap_until_every_index_catches_up_and_search_stays_exact(local_location):
    loc = local_location
    regions, model = build(loc)
    check_searches(LsmReader(loc.uri), model, "before the merge")

    assert not merge_table(loc.uri).failed_regions
    _forget_old_versions(loc)
    summary = gc_table(loc.uri, config=COLLECT)
    assert "generation" not in summary.to_dict()["deleted"], summary.to_dict()
    for r in summary.regions:
        assert r.limited_by.startswith("index_catchup["), (r.region_id, r.limited_by)
    assert [len(generation_dirs(loc, r)) for r in regions] == [2, 2], "a gap generation was collected"
    reader = LsmReader(loc.uri)
    assert len(reader.sources) == 1, "merged: the generations are no source, the base holds their rows"
    check_searches(reader, model, "gap kept, no index caught up")
    assert reader.last_vector_plan.rows_served_flat > 0, "the gap's rows are not covered by the base index"

    catchup_table(loc.uri, index_names=["vec_idx"])  # one index caught up, the other still lags
    _forget_old_versions(loc)
    summary = gc_table(loc.uri, config=COLLECT)
    assert "generation" not in summary.to_dict()["deleted"], summary.to_dict()
    assert {r.limited_by.split(" ")[0] for r in summary.regions} == {"index_catchup[text_idx]"}
    assert [len(generation_dirs(loc, r)) for r in regions] == [2, 2]
    check_searches(LsmReader(loc.uri), model, "gap kept for text_idx, vec_idx caught up")

    catchup_table(loc.uri)
    refresh_snapshot(loc.uri)
    _forget_old_versions(loc)
    summary = gc_table(loc.uri, config=COLLECT)
    assert summary.to_dict()["deleted"]["generation"] == 4, summary.to_dict()
    assert [generation_dirs(loc, r) for r in regions] == [[], []], "caught up: the gap must be collected"
    reader = LsmReader(loc.uri)
    check_searches(reader, model, "caught up, snapshot, collected")
    assert reader.last_vector_plan.rows_served_flat == 0, "every row is covered by the base index again"
    details = MemWalTable(loc.uri).details
    assert all(details.index_catchup[name][r] == 2 for name in ("vec_idx", "text_idx") for r in regions)
