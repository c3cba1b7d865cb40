"""A region's progress through a merge (memwal.merge.RegionProgress): what the merge loop counts per region."""

from __future__ import annotations

import pyarrow as pa

from memwal.errors import CommitConflictError
from memwal.merge import GenerationRef, MergeInput, RegionMergeResult, RegionProgress


def _refs(region: str, *gens: int) -> list[GenerationRef]:
    return [GenerationRef(region, g, f"g{g}", f"/t/{g}", 10) for g in gens]


def test_a_region_fails_at_max_attempts_and_not_before():
    """Two refused attempts with max_attempts 3: still merging; the third ends it with CommitConflictError."""
    p = RegionProgress(RegionMergeResult("r"))
    for _ in range(2):
        p.retry(_refs("r", 4, 5), OSError("stale"), "failed", max_attempts=3)
    assert p.error is None and p.result.conflicts == 2, "a region retries below max_attempts"
    p.retry(_refs("r", 4, 5), OSError("stale"), "failed", max_attempts=3)
    assert isinstance(p.error, CommitConflictError) and "[4, 5] failed 3 times" in str(p.error)


def test_progress_counts_what_landed_and_what_others_merged():
    """Merged up to 2 at start; another merger takes 3..4 (seen at the next round); we land 5..6:
    before 2, after 6, two generations merged by others."""
    p = RegionProgress(RegionMergeResult("r"))
    p.observe(2, first=True)
    p.observe(4, first=False)
    keys = pa.table({"id": pa.array([7], pa.int64())})
    p.landed(_refs("r", 5, 6), MergeInput(lambda: pa.table({}), keys, rows_read=9), upserted=3)
    res = p.finish()
    assert (res.merged_generation_before, res.merged_generation_after) == (2, 6)
    assert res.generations == [5, 6] and res.commits == 1 and res.bytes_read == 20
    assert (res.rows_read, res.rows_upserted, res.rows_deleted) == (9, 3, 1)
    assert res.generations_merged_by_others == 2, "3 and 4 were merged by the other merger"
