"""One merge commit as two Lance merge-inserts whose cost follows the backlog, not the base table.

Why two: Lance 14 plans `when_not_matched_by_source_delete(...)` as a full outer hash join over every
row of the target (no index, no pushdown), while `merge_insert(key).when_matched_delete()` with a source
of the deleted keys, and a plain upsert, use the key's scalar index. No single merge-insert of Lance 14
both upserts and deletes by key, and a hand-combined transaction cannot carry the marker (pylance's
`Transaction` drops `mark_sstables_as_compacted`). So:

1. the **delete pass**: the batch's deleted keys, `when_matched_delete()`;
2. the **upsert pass**: the upserts, carrying every region's `merged_generations` marker (a commit with
   deletes only puts the marker on the delete pass). Progress still moves in the same commit as the last
   data it covers, and a stale marker is still refused.

Cost: each pass joins its source to the table on the key, through the key's scalar index when the
source is small against the table, else by scanning the key column alone (`ROWS_PER_INDEXED_KEY`, set
from measurement); never the full outer join over every row and column that a by-source delete plans.

Why it is safe (each case is a test in tests/test_merge_passes.py and tests/crash/):
- Each pass refreshes the table handle to the latest version v and first checks that merged_generations
  of every region in the commit is still where the plan started (`since`); if not, another merger
  overtook us and the whole commit is replanned (`Overtaken`, handled like a stale marker). So a pass only
  ever deletes rows of keys whose tombstone sits in a generation that is unmerged at v.
- Lance's own retry (`conflict_retries`, default 10) is off: it re-runs the join on the latest version,
  where a merger not holding our lock may have re-inserted a deleted key from a later generation, and the
  delete pass, having no marker, would not be refused. With retries off, Lance either rebases the pass
  onto v's row addresses (it keeps the deletion vectors of concurrent commits on other rows) or raises a
  conflict; on a conflict we reopen, check progress again and rerun the pass (`attempts`).
- Between the passes a reader sees the deleted keys gone from the base, but their tombstones still sit in
  unmerged generations and shadow the base: the LSM view is exact. A crash there leaves exactly that
  state; the rerun plans the same batch, its delete pass matches nothing, its upsert pass commits.
- Our mergers hold the MemWAL index lock across both passes, so none of them commits in between.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import lance
import pyarrow as pa
from lance.mem_wal import CompactedSsTable

from memwal.faults import fault_point
from memwal.table import MemWalTable

__all__ = ["CommitPasses", "Overtaken", "commit_passes", "is_conflict"]

log = logging.getLogger(__name__)

PASS_ATTEMPTS = 5  # conflicts of one pass with non-merge commits (compaction, indexes) before giving up
# The join's path, set from bench/merge_scale.py (pylance 14, int64 key with a BTREE, 1M-row fragments):
# through the key's index a pass pays about 35-110 us per source key (BTREE pages loaded per key);
# scanning the key column about 6-12 ns per table row, but 25-40 ns once fragments carry deletion files
# (the scan is cut into ranges around deleted rows: 31 ranges became 2,030 after 12,000 deletions at 32M
# rows). So the index only when the table has this many rows per source key.
ROWS_PER_INDEXED_KEY = 10_000
ROWS_PER_INDEXED_KEY_WITH_DELETIONS = 1_500


class Overtaken(OSError):
    """merged_generations of a region of this commit moved since the commit was planned: replan."""


@dataclass
class CommitPasses:
    """What one commit did: rows upserted and deleted, Lance commits made, and seconds per pass."""

    upserted: int = 0
    deleted: int = 0
    table_commits: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)


def is_conflict(exc: BaseException) -> bool:
    """Lance refused a pass because a concurrent commit conflicts with it (retries are off)."""
    return "Too many concurrent writers" in str(exc)


def _check_progress(table: MemWalTable, since: Mapping[str, int]) -> None:
    """Raise Overtaken unless every region's merged generation at the handle's version is as planned."""
    version = table.version
    details = table.details
    moved = {r: details.merged_generation(r) for r, g in since.items() if details.merged_generation(r) != g}
    if moved:
        raise Overtaken(f"merged_generations moved since the commit was planned (at table version {version}: "
                        + ", ".join(f"{r} {since[r]} -> {g}" for r, g in moved.items()) + ")")


def _use_index(ds: lance.LanceDataset, keys: int) -> bool:
    """Join through the key's index (else scan the key column): the cheaper one by the measured costs."""
    fragments = ds.get_fragments()
    deletions = any(f.metadata.deletion_file is not None for f in fragments)
    rows_per_key = ROWS_PER_INDEXED_KEY_WITH_DELETIONS if deletions else ROWS_PER_INDEXED_KEY
    return keys * rows_per_key <= sum(f.metadata.physical_rows for f in fragments)


def _run_pass(table: MemWalTable, since: Mapping[str, int], build: Callable, source: pa.Table,
              what: str) -> dict:
    """One pass on the latest version after the progress check, without Lance's retry; a conflict
    refreshes, checks again and reruns (at most PASS_ATTEMPTS times). The handle ends at the pass's commit."""
    for attempt in range(1, PASS_ATTEMPTS + 1):
        ds = table.refresh().dataset
        _check_progress(table, since)
        try:
            return build(ds).use_index(_use_index(ds, source.num_rows)).conflict_retries(0).execute(source)
        except OSError as exc:
            if not is_conflict(exc) or attempt == PASS_ATTEMPTS:
                raise
            log.info("merge %s pass conflicted with a concurrent commit (attempt %d): %s; refreshing",
                     what, attempt, str(exc).splitlines()[0])
    raise AssertionError("unreachable")


def commit_passes(table: MemWalTable, markers: Sequence[tuple[str, int]], since: Mapping[str, int],
                  upserts: pa.Table, deleted_keys: pa.Table) -> CommitPasses:
    """Apply one commit's deletes, then its upserts with one marker per region (see module docstring), on
    the table's key. Call under the MemWAL index lock. `since`: merged generation per region the plan
    started from."""
    out = CommitPasses()
    compacted = [CompactedSsTable(r, g) for r, g in markers]
    pk = list(table.primary_key)
    if deleted_keys.num_rows:
        only = upserts.num_rows == 0

        def delete(ds: lance.LanceDataset):
            b = ds.merge_insert(pk).when_matched_delete()
            return b.mark_sstables_as_compacted(compacted) if only else b

        started = time.monotonic()
        stats = _run_pass(table, since, delete, deleted_keys, "delete")
        out.timings_s["delete_pass"] = time.monotonic() - started
        out.deleted, out.table_commits = stats.get("num_deleted_rows", 0), 1
        if only:
            return out
        fault_point("merge.between_passes")

    def upsert(ds: lance.LanceDataset):
        return (ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all()
                .mark_sstables_as_compacted(compacted))

    started = time.monotonic()
    _run_pass(table, since, upsert, upserts, "upsert")
    out.timings_s["upsert_pass"] = time.monotonic() - started
    out.upserted = upserts.num_rows
    out.table_commits += 1
    return out
