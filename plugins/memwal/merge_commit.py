"""One merge commit as a delete pass and an upsert pass: no join over every row of the base table.

Why two: Lance 14 plans `when_not_matched_by_source_delete(...)` as a full outer hash join over every
row of the target (no index, no pushdown), while a delete of the keys and a plain upsert use the key's
scalar index or scan the key column alone. No single merge-insert of Lance 14 both upserts and deletes by
key, and a hand-combined transaction cannot carry the marker (pylance's `Transaction` drops
`mark_sstables_as_compacted`). So:

1. the **delete pass**: the batch's deleted keys. On a one-column key, a Lance delete of `key IN (...)`
   (a Delete operation, through the key's index); on a composite key, `merge_insert(key).when_matched_delete()`;
2. the **upsert pass**: the upserts, carrying every region's `merged_generations` marker (a commit with
   deletes only puts the marker on its delete pass, always a merge-insert). Progress still moves in the same
   commit as the last data it covers, and a stale marker is still refused.

**Upserts first** (`plan_passes`, issue 44): when every region's winning tombstones lie above its first
generation (a batch whose first generation holds no delete that survives, as an upsert stream followed by
deletes), the upsert pass goes first and carries every region's step since+1, and the delete pass (a
merge-insert `when_matched_delete`, which can carry a marker) follows with step since+2: a two-generation
batch then costs two Lance commits, not three. Step since+1 on the upsert pass is exact because, once it
lands, the base holds the newest state of every key whose newest version lies in generation since+1 (its
upserts are in; it has no winning tombstone), and every key still to delete has its tombstone in a
generation above the marker, which shadows the key for every reader until the delete pass lands.

Cost: each pass joins its source to the table on the key, through the key's scalar index when the source
is small against the table, else by scanning the key column alone (`ROWS_PER_INDEXED_KEY`, set from
measurement); never the full outer join over every row and column that a by-source delete plans. The
upsert pass reads the version **just before our delete pass** when that delete is the only commit since:
Lance cuts a scan into ranges around deleted rows, and the delete pass's fresh deletions made the
upsert's key scan about 3x slower (0.61 against 0.23 s at 32M rows, bench/merge_scale.py). Lance
rebases the upsert onto our Delete, keeping both deletion vectors (the two passes' keys are disjoint:
one winner per key); should it refuse, the pass reruns on the latest version.

Why it is safe (each case is a test in tests/library/test_merge_passes.py and tests/crash/):
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
- The upsert pass read before our delete carries the marker: a merger not holding our lock that commits
  after its check makes Lance refuse it (a stale marker, or a conflict; then we check again and replan),
  so the rebase never lays older upserts over newer ones. It reads the old version only when our delete
  is the only commit since; after a compaction or any other commit it reads the latest.
- Our mergers hold the MemWAL index lock across both passes, so none of them commits in between; every
  commit first checks that our lease on it was not lost (`MemWalTable.check_lease`, `LeaseLostError`).

Progress moves one generation at a time (`marker_steps`), which is what makes it atomic with the data.
Lance checks a marker at commit time, against the latest version, as "proposed > recorded": a marker of
G over a batch since+1..G passes even when another merger committed since+1..G' (G' < G) after our data
and wrote older rows over ours (the lost update of issue 32). A marker of since+1 passes exactly when
nothing advanced the region since our plan. So the last data commit carries since+1 for every region of the
commit, and marker-only commits (an empty merge-insert) follow with since+2, ..., G, each region advancing
one generation per commit. Any merger (ours, one that lost its lease, Lance core's, another tool's) that
commits between two of our commits has advanced the region to some G' >= since+1: our next step is refused
as stale and the merge replans from G', re-applying every generation above G' (whose newest rows win
again). Between steps the base holds rows as new as or newer than merged_generations claims, and the
generations above it still shadow them with the same newest rows: every reader's view stays exact; a crash
between steps leaves that state and the rerun converges. A batch of one generation per region (the
streaming case) costs no extra commit; each extra generation costs one marker-only commit, except the
second one of an upserts-first commit, which rides on its delete pass. Upserts first, every data pass
carries a marker for every region of the commit (an unmarked upsert pass could insert a fresh key that a
merger not holding our lock inserts too, and nothing would refuse it), so it is taken only when every region
can carry its first step there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import lance
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

from memwal.faults import fault_point
from memwal.index_read_ahead import keys_read_ahead
from memwal.table import MemWalTable

__all__ = ["CommitPasses", "Overtaken", "PassOrder", "advance_markers", "check_progress", "commit_passes",
           "is_conflict", "marker_steps", "plan_passes", "run_pass", "use_index", "use_index_to_delete"]

log = logging.getLogger(__name__)

PASS_ATTEMPTS = 5  # conflicts of one pass with non-merge commits (compaction, indexes) before giving up
# The join's path, set from bench/merge_scale.py (pylance 14, int64 key with a BTREE, 1M-row fragments):
# through the key's index a pass pays about 35-110 us per source key (BTREE pages loaded per key);
# scanning the key column about 6-12 ns per table row, but 25-40 ns once fragments carry deletion files
# (the scan is cut into ranges around deleted rows: 31 ranges became 2,030 after 12,000 deletions at 32M
# rows). So the index only when the table has this many rows per source key (the upsert pass; the delete
# pass of a composite key). The Lance delete of a one-column key takes the index whenever there is one: at
# worst, with more keys than index pages, that costs about what a key scan does (10,000 keys at 32M rows:
# 0.34 s through the index, 0.25 s scanning; the same at 1M), and it spares the upsert pass our deletions.
ROWS_PER_INDEXED_KEY = 10_000
ROWS_PER_INDEXED_KEY_WITH_DELETIONS = 1_500
# The delete pass (a `when_matched_delete`: no rows to take or write) pays through the index little more than
# the BTREE pages its keys fall in, at worst every page once; on a table with deletion files (the delete pass
# of an upserts-first commit always follows our upsert's) that beats the cut-up key scan down to 20 rows per
# key at 1M rows and 80 at 8M (bench/README.md, issue 44: 2,000 keys at 1M 0.032 against 0.060 s, 20,000 at
# 8M 0.22 against 0.30 s, 100,000 at 1M 0.12 against 0.086 s). On a clean table the scan stays cheaper (8M
# rows, 2,000 keys: 0.079 s scanning, 0.165 s through the index): ROWS_PER_INDEXED_KEY applies.
ROWS_PER_INDEXED_DELETE_WITH_DELETIONS = 50


class Overtaken(OSError):
    """merged_generations of a region of this commit moved since the commit was planned: replan."""


@dataclass
class CommitPasses:
    """What one commit did: rows upserted and deleted, Lance commits made, seconds per pass, and whether
    the upsert pass read the version before our delete pass (see the module docstring)."""

    upserted: int = 0
    deleted: int = 0
    table_commits: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)
    upsert_before_delete_pass: bool = False


def is_conflict(exc: BaseException) -> bool:
    """Lance refused a pass because a concurrent commit conflicts with it (retries are off)."""
    return "Too many concurrent writers" in str(exc)


def check_progress(table: MemWalTable, since: Mapping[str, int]) -> None:
    """Raise Overtaken unless every region's merged generation at the handle's version is as planned."""
    version = table.version
    details = table.details
    moved = {r: details.merged_generation(r) for r, g in since.items() if details.merged_generation(r) != g}
    if moved:
        raise Overtaken(f"merged_generations moved since the commit was planned (at table version {version}: "
                        + ", ".join(f"{r} {since[r]} -> {g}" for r, g in moved.items()) + ")")


def use_index(ds: lance.LanceDataset, keys: int | pa.Table, pk: Sequence[str] = ()) -> bool:
    """Join through the key's index (else scan the key column): the cheaper one by the measured costs.
    `keys`: a count, or the source table (then, for a one-column integer key, only the keys within the key
    index's [min, max] count: a key outside it costs the index nothing, as the fresh keys of an append
    stream; measured at 32M rows, 200,000 such inserts 0.49 s scanning, 0.09 s through the index). No keys
    (a marker commit with no fresh rows): no index, Lance's join then ends at once (measured at 4.5M rows,
    2M of them not indexed yet: 0.015 s and +2 MiB, against 0.30 s and +199 MiB through the index)."""
    return _cheaper_through_index(ds, keys, pk, ROWS_PER_INDEXED_KEY_WITH_DELETIONS)


def use_index_to_delete(ds: lance.LanceDataset, keys: int | pa.Table, pk: Sequence[str] = (),
                        assume_deletions: bool = False) -> bool:
    """The delete pass's join path (a merge-insert `when_matched_delete`): as `use_index`, but on a table with
    deletion files the index already pays from ROWS_PER_INDEXED_DELETE_WITH_DELETIONS rows per key.
    assume_deletions: decide as for the table once it has deletion files (after our upsert pass)."""
    return _cheaper_through_index(ds, keys, pk, ROWS_PER_INDEXED_DELETE_WITH_DELETIONS, assume_deletions)


def _cheaper_through_index(ds: lance.LanceDataset, keys: int | pa.Table, pk: Sequence[str],
                           rows_per_key_with_deletions: int, assume_deletions: bool = False) -> bool:
    n = keys if isinstance(keys, int) else _keys_in_index_range(ds, keys, pk)
    if n == 0:
        return isinstance(keys, pa.Table) and keys.num_rows > 0
    fragments = ds.get_fragments()
    deletions = assume_deletions or any(f.metadata.deletion_file is not None for f in fragments)
    rows_per_key = rows_per_key_with_deletions if deletions else ROWS_PER_INDEXED_KEY
    return n * rows_per_key <= sum(f.metadata.physical_rows for f in fragments)


def _keys_in_index_range(ds: lance.LanceDataset, source: pa.Table, pk: Sequence[str]) -> int:
    """Rows of `source` whose key lies within the [min, max] Lance reports for the key's index (all of them
    when the key is not one integer column with such an index)."""
    if len(pk) != 1 or not pa.types.is_integer(source.schema.field(pk[0]).type) or not source.num_rows:
        return source.num_rows
    name = next((d.name for d in ds.describe_indices() if list(d.field_names) == list(pk)), None)
    try:
        segments = ds.stats.index_stats(name).get("segments") or [] if name else []
        lo = min(int(s["min"]) for s in segments)
        hi = max(int(s["max"]) for s in segments)
    except (KeyError, TypeError, ValueError, OSError):  # no index, or no range Lance reports for it
        return source.num_rows
    column = source.column(pk[0])
    return int(pc.sum(pc.and_(pc.greater_equal(column, lo), pc.less_equal(column, hi))).as_py() or 0)


Pass = Callable[[lance.LanceDataset], dict]


def run_pass(table: MemWalTable, since: Mapping[str, int], execute: Pass, what: str,
              pinned: tuple[int, int] | None = None, known: int | None = None) -> tuple[dict, int, bool]:
    """One pass after the progress check, without Lance's retry; a conflict refreshes, checks again and
    reruns (at most PASS_ATTEMPTS times). The pass reads the latest version, or, on its first attempt,
    pinned = (read, committed) of our delete pass: the version our delete read, when the latest is still
    the one it committed. known: a version our own previous commit made, at which progress is `since`: if it
    is still the latest, the check needs no index load. Returns (Lance's stats, the version read, whether
    that was the pinned one); the handle ends at the pass's commit."""
    for attempt in range(1, PASS_ATTEMPTS + 1):
        ds = table.refresh().dataset
        if ds.version != known:
            check_progress(table, since)
        table.check_lease()
        use_pinned = attempt == 1 and pinned is not None and ds.version == pinned[1]
        if use_pinned:
            ds = ds.checkout_version(pinned[0])
        read = ds.version
        try:
            stats = execute(ds)
        except OSError as exc:
            if not is_conflict(exc) or attempt == PASS_ATTEMPTS:
                raise
            log.info("merge %s pass conflicted with a concurrent commit (attempt %d, read version %d): %s; "
                     "refreshing", what, attempt, read, str(exc).splitlines()[0])
            continue
        if use_pinned:
            table.refresh()
        return stats, read, use_pinned
    raise AssertionError("unreachable")


def _delete_pass(pk: list[str], keys: pa.Table, marker: list[CompactedSsTable] | None) -> Pass:
    """The delete pass: a Lance delete of `key IN (...)` on a one-column key without a marker, else a
    merge-insert `when_matched_delete` (which can carry the marker)."""
    if len(pk) == 1 and marker is None:
        predicate = pc.field(pk[0]).isin(keys.column(pk[0]).combine_chunks())
        return lambda ds: ds.delete(predicate, conflict_retries=0)

    def execute(ds: lance.LanceDataset) -> dict:
        b = ds.merge_insert(pk).when_matched_delete()
        if marker is not None:
            b = b.mark_sstables_as_compacted(marker)
        return b.use_index(use_index_to_delete(ds, keys, pk)).conflict_retries(0).execute(keys)

    return execute


def marker_steps(markers: Sequence[tuple[str, int]], since: Mapping[str, int]) -> list[list[tuple[str, int]]]:
    """A commit's markers (region, last generation) as steps of one generation per region: step k moves
    every region whose batch reaches since+k to since+k (module docstring: why one at a time)."""
    steps: list[list[tuple[str, int]]] = []
    k = 1
    while step := [(r, since[r] + k) for r, g in markers if since[r] + k <= g]:
        steps.append(step)
        k += 1
    return steps


def advance_markers(table: MemWalTable, steps: Sequence[Sequence[tuple[str, int]]]) -> int:
    """The marker-only commits after the first step (committed with the last data): each an empty
    merge-insert carrying one step, made only while every region of it is still where the step before left
    it (else `Overtaken`, or Lance's stale-marker refusal: replan). Returns the commits made."""
    made = 0
    for step in steps:
        fault_point("merge.between_marker_steps")
        known = table.version  # our previous commit: progress there is what the step before recorded
        at = {r: g - 1 for r, g in step}
        compacted = [CompactedSsTable(r, g) for r, g in step]

        def execute(ds: lance.LanceDataset, compacted=compacted) -> dict:
            return (ds.merge_insert(list(table.primary_key)).when_matched_update_all().when_not_matched_insert_all()
                    .mark_sstables_as_compacted(compacted).use_index(False).conflict_retries(0)
                    .execute(ds.schema.empty_table()))

        run_pass(table, at, execute, "marker step", known=known)
        made += 1
    return made


@dataclass(frozen=True)
class PassOrder:
    """Which pass goes first and the marker steps each commit carries (`plan_passes`): `first` rides on the
    first of two passes (none when the deletes go first), `last` on the last data pass, `rest` are the
    marker-only commits after it."""

    upserts_first: bool
    first: list[tuple[str, int]]
    last: list[tuple[str, int]]
    rest: list[list[tuple[str, int]]]


Winners = Mapping[str, tuple[int | None, int | None]]


def plan_passes(markers: Sequence[tuple[str, int]], since: Mapping[str, int], winners: Winners,
                upserts: bool, deletes: bool) -> PassOrder:
    """The passes' order and their marker steps. Deletes first (the default: the upsert pass then reads the
    version before our Lance delete, module docstring) carries every region's first step on the upsert
    pass. Upserts first is taken only when it saves a marker-only commit and every region of the commit
    can carry its first step on the upsert pass: the step `since+1` may ride on a pass only if, once it
    lands, the base holds the newest state of every key whose newest version lies in generation since+1
    or below; after the upsert pass that fails exactly for a key whose winning tombstone is in since+1.
    `winners`: per region, the lowest generation holding a winning upsert and a winning tombstone (None:
    there is none); a region it lacks is unknown, so never first on the upsert pass."""
    steps = marker_steps(markers, since)
    if not (upserts and deletes):
        return PassOrder(False, [], steps[0], steps[1:])
    default = PassOrder(False, [], steps[0], steps[1:])
    early = all(r in winners and (winners[r][1] is None or winners[r][1] > since[r] + 1) for r, _ in markers)
    if not early:
        return default
    after = {r: since[r] + 1 for r, _ in markers}
    second = marker_steps([(r, g) for r, g in markers if g > after[r]], after)
    if not second or len(second) - 1 >= len(steps) - 1:  # no tombstone left for a last pass, or nothing saved
        return default
    return PassOrder(True, steps[0], second[0], second[1:])


def commit_passes(table: MemWalTable, markers: Sequence[tuple[str, int]], since: Mapping[str, int],
                  upserts: pa.Table, deleted_keys: pa.Table, winners: Winners | None = None) -> CommitPasses:
    """Apply one commit's deletes and upserts in the order `plan_passes` picks, each data pass with its
    marker steps, then the marker-only steps (see module docstring), on the table's key. Call under the
    MemWAL index lock. `since`: merged generation per region the plan started from; `winners`: see
    `plan_passes`."""
    order = plan_passes(markers, since, winners or {}, upserts.num_rows > 0, deleted_keys.num_rows > 0)
    if order.upserts_first:
        return _upserts_first(table, since, upserts, deleted_keys, order)
    out = CommitPasses()
    compacted = [CompactedSsTable(r, g) for r, g in order.last]
    pk = list(table.primary_key)
    pinned = None
    if deleted_keys.num_rows:
        only = upserts.num_rows == 0
        started = time.monotonic()
        stats, read, _ = run_pass(table, since, _delete_pass(pk, deleted_keys, compacted if only else None),
                                   "delete")
        out.timings_s["delete_pass"] = time.monotonic() - started
        out.deleted, out.table_commits = stats.get("num_deleted_rows", 0), 1
        if only:
            out.table_commits += advance_markers(table, order.rest)
            return out
        if len(pk) == 1:
            # a Delete operation, which Lance rebases an upsert onto; the delete moved the handle's dataset
            # to its commit (were it not so, the latest would differ from it and the upsert read the latest)
            pinned = (read, table.version)
        fault_point("merge.between_passes")

    started = time.monotonic()
    _, _, out.upsert_before_delete_pass = run_pass(table, since, _upsert_pass(pk, upserts, compacted), "upsert",
                                                   pinned)
    out.timings_s["upsert_pass"] = time.monotonic() - started
    out.upserted = upserts.num_rows
    out.table_commits += 1 + advance_markers(table, order.rest)
    return out


def _read_ahead_reader(table: MemWalTable, deleted_keys: pa.Table, pk: list[str]) -> lance.LanceDataset | None:
    """A dataset sharing the handle's session to read the delete pass's keys ahead on while the upsert pass
    runs (`memwal.index_read_ahead`), when that pass will join through the key's index: a one-column key with
    a scalar index and few enough keys for a table with deletion files (our upsert pass makes them). None
    otherwise, and when it cannot be opened: only an optimisation, it never fails the merge (the version read
    may be gone already: retention removed it after a concurrent commit, a race test saw "Not found")."""
    ds = table.dataset
    try:
        if len(pk) != 1 or not any(list(d.field_names) == pk for d in ds.describe_indices()):
            return None
        if not use_index_to_delete(ds, _keys_in_index_range(ds, deleted_keys, pk), assume_deletions=True):
            return None
        return table.open_dataset(ds.version, same_session=True)
    except (OSError, ValueError) as exc:
        log.debug("no index read-ahead for the delete pass of %s: %s", table.uri, exc)
        return None


def _upsert_pass(pk: list[str], upserts: pa.Table, compacted: list[CompactedSsTable]) -> Pass:
    def execute(ds: lance.LanceDataset) -> dict:
        return (ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all()
                .mark_sstables_as_compacted(compacted)
                .use_index(use_index(ds, upserts, pk)).conflict_retries(0).execute(upserts))

    return execute


def _upserts_first(table: MemWalTable, since: Mapping[str, int], upserts: pa.Table, deleted_keys: pa.Table,
                   order: PassOrder) -> CommitPasses:
    """The upsert pass with every region's first step, then the delete pass (a merge-insert) with the next
    steps, then the marker-only rest: one commit fewer than deletes first (`plan_passes` says when)."""
    out = CommitPasses()
    pk = list(table.primary_key)
    started = time.monotonic()
    with keys_read_ahead(_read_ahead_reader(table, deleted_keys, pk), pk[0], deleted_keys.column(pk[0])):
        run_pass(table, since, _upsert_pass(pk, upserts, [CompactedSsTable(r, g) for r, g in order.first]),
                 "upsert")
    out.timings_s["upsert_pass"] = time.monotonic() - started
    out.upserted, out.table_commits = upserts.num_rows, 1
    fault_point("merge.between_passes")
    known = table.version  # our upsert pass: progress there is its first steps
    started = time.monotonic()
    stats, _, _ = run_pass(table, {r: g for r, g in order.first},
                           _delete_pass(pk, deleted_keys, [CompactedSsTable(r, g) for r, g in order.last]),
                           "delete", known=known)
    out.timings_s["delete_pass"] = time.monotonic() - started
    out.deleted = stats.get("num_deleted_rows", 0)
    out.table_commits += 1 + advance_markers(table, order.rest)
    return out
