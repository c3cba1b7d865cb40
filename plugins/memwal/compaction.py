"""Compaction of the base table with Lance's distributed API: plan on the driver, execute the tasks in
process or on Spark executors (tasks pickle), commit on the driver with the options of the plan.

When it is due: `memwal.fragment_health.due_reasons` (re-exported here with the fragment health helpers).

Merges race compaction. A merge that commits between the plan and the compaction's commit makes Lance
refuse the commit as preempted when they share a fragment; then the results of the tasks whose fragments
the merge did not touch are committed, and the rest is planned again. A compaction that commits first makes
the merge retry. With `use_lock` (the default) each round (plan, execute, commit) holds the MemWAL index
lock, so our merges wait for the round instead of preempting it, and `max_tasks_per_round` bounds how long
they wait. Other indexes are remapped at commit. Lance keeps `merged_generations` and the snapshot of
the `__lance_mem_wal` entry, but its index remap drops `index_catchup` (pylance 14.0.2), which would read
as "caught up": each round restores the entries it had, under the lock, for every index that still covers
every fragment, else records 0 (the next catch-up raises it again). The entries are first written to
`_mem_wal/_compaction/index_catchup.json`, before Lance's commit: when the restore fails (or the process dies
before it), the next run puts them back from there, even when compaction is no longer due. Meanwhile GC and
status read an index with no entry as caught up only if it covers every live fragment (memwal.index_coverage).

Lance does not combine fragments covered by different segments of one index: when compaction is still due
after its run, `blocked_by_index_segments` names the indexes whose segments split the small fragments (and
their segment counts), and the next catch-up folds them (`memwal.index_segments`). Lance does not combine an
indexed fragment with one the index does not cover yet either: `blocked_by_unindexed_fragments` names those
indexes (and how many small fragments each leaves out), which the next catch-up covers.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import lance
from lance.commit import CommitConflictError as LanceCommitConflictError
from lance.optimize import Compaction, CompactionOptions, CompactionTask, RewriteResult

from memwal import naming
from memwal.faults import fault_point
from memwal.fragment_health import FragmentHealth, due_reasons, fragment_health, is_small
from memwal.index_coverage import covers_every_fragment
from memwal.maintenance_config import CompactionConfig
from memwal.mem_wal_index import MemWalIndexDetails
from memwal.table import MemWalTable, TableLike

__all__ = ["PENDING_CATCHUP", "CompactionConfig", "CompactionSummary", "FragmentHealth", "compact_table",
           "due_reasons", "execute_in_process", "fragment_health", "is_preempted", "is_small"]

log = logging.getLogger(__name__)

# Runs the planned tasks against the table (uri, storage options) and returns their results in task order.
Execute = Callable[[Sequence[CompactionTask], MemWalTable], list[RewriteResult]]

# index_catchup as it was before a round's commit, kept until the round has put it back (module docstring).
PENDING_CATCHUP = f"{naming.MEM_WAL_DIR}/_compaction/index_catchup.json"

# Lance's RetryableCommitConflict, raised by pylance 14 as a plain OSError (measured: a Rewrite preempted by
# a concurrent Update, Delete or Rewrite; catch-up's CreateIndex preempted by a Rewrite or a CreateIndex):
# "Retryable commit conflict for version N: This Rewrite transaction was preempted by concurrent
# transaction Update at version N. Please retry." (or "... preempted by a concurrent update that moved ...").
_PREEMPTED = re.compile(r"Retryable commit conflict for version \d+: This \w+ transaction was preempted by "
                        r"(?:concurrent transaction|a concurrent update)")


def lance_options(config: CompactionConfig) -> CompactionOptions:
    """Lance's options, the same for the plan and the commit (the commit remaps indexes with them)."""
    return CompactionOptions(target_rows_per_fragment=config.target_rows_per_fragment,
                             materialize_deletions_threshold=config.materialize_deletions_threshold)


def execute_in_process(tasks: Sequence[CompactionTask], table: MemWalTable) -> list[RewriteResult]:
    """Run the tasks here, one after another (each uses Lance's own threads)."""
    ds = table.open_dataset()  # the version the plan read (still the latest)
    return [task.execute(ds) for task in tasks]


def is_preempted(exc: BaseException) -> bool:
    """Lance refused a commit (compaction's, or catch-up's index commit) because a concurrent commit changed
    what it read: planning again may succeed. Only Lance's own preemption: any other error, e.g. a store's
    "409 Conflict", is a failure to report."""
    if isinstance(exc, LanceCommitConflictError):  # newer pylance raise this type: retryable means preempted
        return bool(exc.retryable)
    return isinstance(exc, OSError) and _PREEMPTED.search(str(exc)) is not None


def _fragment_key(meta: Any) -> tuple:
    deletion = meta.deletion_file
    return (tuple(f.path for f in meta.files),
            None if deletion is None else (deletion.id, deletion.read_version, deletion.num_deleted_rows))


def untouched_tasks(tasks: Sequence[CompactionTask], latest: lance.LanceDataset) -> list[int]:
    """Indexes of the tasks whose source fragments are, at `latest`, as the plan saw them."""
    now = {frag.fragment_id: _fragment_key(frag.metadata) for frag in latest.get_fragments()}
    return [i for i, task in enumerate(tasks)
            if all(now.get(meta.id) == _fragment_key(meta) for meta in task.fragments)]


@dataclass
class CompactionSummary:
    table_uri: str
    enabled: bool = True
    due: list[str] = field(default_factory=list)
    health_before: dict[str, Any] = field(default_factory=dict)
    health_after: dict[str, Any] = field(default_factory=dict)
    table_version_before: int = 0
    table_version_after: int = 0
    rounds: int = 0
    tasks_planned: int = 0
    tasks_committed: int = 0
    tasks_preempted: int = 0
    preempted_commits: int = 0
    fragments_removed: int = 0
    fragments_added: int = 0
    files_removed: int = 0
    files_added: int = 0
    lock_wait_s: float = 0.0
    lock_held_s: float = 0.0
    duration_s: float = 0.0
    blocked_by_index_segments: dict[str, int] = field(default_factory=dict)
    blocked_by_unindexed_fragments: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "job": "compaction", "compacted": self.tasks_committed > 0}


def _commit(ds: lance.LanceDataset, results: list[RewriteResult], config: CompactionConfig,
            summary: CompactionSummary) -> None:
    metrics = Compaction.commit(ds, results, options=lance_options(config))
    summary.fragments_removed += metrics.fragments_removed
    summary.fragments_added += metrics.fragments_added
    summary.files_removed += metrics.files_removed
    summary.files_added += metrics.files_added


def _read_pending(table: MemWalTable) -> dict[str, dict[str, int]]:
    """The entries a round recorded before its commit and has not put back yet ({} when none)."""
    try:
        raw = table.store.get(PENDING_CATCHUP)
    except FileNotFoundError:
        return {}
    try:
        return {str(n): {str(r): int(g) for r, g in regions.items()}
                for n, regions in json.loads(raw)["index_catchup"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("compaction of %s: ignoring unreadable %s (%s); GC and status read the indexes' coverage "
                    "from Lance, the next catch-up records it", table.uri, PENDING_CATCHUP, exc)
        return {}


def _record_pending(table: MemWalTable, entries: dict[str, dict[str, int]]) -> None:
    """Write the entries Lance's index remap is about to drop, before the commit."""
    table.store.put(PENDING_CATCHUP, json.dumps({"index_catchup": entries}, sort_keys=True).encode())


def _restore_catchup(table: MemWalTable, before: dict[str, dict[str, int]], locked: bool) -> None:
    """Put back the index_catchup entries Lance's index remap dropped (see the module docstring): for each
    index of `before` that has no entry now, its old entry if it still covers every fragment, else 0. An entry
    Lance kept for an index its remap no longer covers every fragment with (a ZoneMap is not remapped at all,
    pylance 14.0.2) is set to 0: it is not caught up until the next catch-up covers the rewritten fragments.
    Then forget the recorded entries (they stay recorded if this fails: the next run retries)."""
    current = table.refresh().details.index_catchup
    ds = table.dataset
    absent, lowered = {}, {}
    for name, per_region in before.items():
        covered = covers_every_fragment(ds, name)
        if name not in current:
            absent[name] = dict(per_region) if covered else dict.fromkeys(per_region, 0)
        elif not covered and any(current[name].values()):
            lowered[name] = dict.fromkeys(current[name], 0)
    if absent or lowered:
        def mutate(d: MemWalIndexDetails) -> MemWalIndexDetails:
            return replace(d, index_catchup={**absent, **d.index_catchup, **lowered})

        if locked:
            table.commit_details_locked(mutate)
        else:
            table.commit_details(mutate)
        log.info("compaction of %s: index_catchup after Lance's index remap: restored %s, not caught up %s",
                 table.uri, absent, sorted(lowered))
    if before:
        table.store.delete(PENDING_CATCHUP)


def _to_restore(table: MemWalTable) -> dict[str, dict[str, int]]:
    """index_catchup now, plus what an earlier round recorded and could not put back (now's entries win)."""
    now = {k: dict(v) for k, v in table.refresh().details.index_catchup.items()}
    return {**_read_pending(table), **now}


def _round(table: MemWalTable, config: CompactionConfig, execute: Execute, summary: CompactionSummary) -> bool:
    """Plan, execute and commit one round; True when there may be more to do. Under the MemWAL index lock,
    each commit is fenced by the lease (`MemWalTable.check_lease`): a stalled round whose lock was taken over
    does not commit."""
    ds = table.open_dataset()  # its own object: the commits read at the plan's version
    plan = Compaction.plan(ds, lance_options(config))
    tasks = list(plan.tasks)[: config.max_tasks_per_round or None]
    if not tasks:
        return False
    summary.tasks_planned += len(tasks)
    results = execute(tasks, table)
    fault_point("compaction.before_commit")
    try:
        table.check_lease()
        _commit(ds, results, config, summary)
        summary.tasks_committed += len(tasks)
    except OSError as exc:
        if not is_preempted(exc):
            raise
        summary.preempted_commits += 1
        keep = untouched_tasks(tasks, table.open_dataset())
        log.info("compaction of %s preempted by a concurrent commit; committing %d of %d tasks whose fragments "
                 "it did not touch", table.uri, len(keep), len(tasks))
        summary.tasks_preempted += len(tasks) - len(keep)
        if keep:
            try:
                table.check_lease()
                _commit(ds, [results[i] for i in keep], config, summary)
                summary.tasks_committed += len(keep)
            except OSError as again:
                if not is_preempted(again):
                    raise
                summary.tasks_preempted += len(keep)
        return True
    fault_point("compaction.after_commit")
    return len(tasks) < plan.num_tasks()


def compact_table(table: TableLike, config: CompactionConfig | None = None,
                  execute: Execute = execute_in_process) -> CompactionSummary:
    """Compact the base table when due (or forced); rounds go on while tasks remain, a preempted round is
    planned again up to max_attempts times. The handle ends at the latest version."""
    config = config or CompactionConfig()
    started = time.monotonic()
    table = MemWalTable.of(table)
    uri = table.uri
    ds = table.refresh().dataset
    summary = CompactionSummary(uri, config.enabled, table_version_before=ds.version)
    health = fragment_health(ds, config.target_rows_per_fragment)
    summary.health_before = health.to_dict()
    summary.due = due_reasons(health, config) or (["forced"] if config.force else [])
    refused = 0
    if table.store.exists(PENDING_CATCHUP):  # an earlier run committed and could not put the entries back
        with table.index_lock() if config.use_lock else nullcontext():
            _restore_catchup(table, _to_restore(table), config.use_lock)
    while config.enabled and summary.due:
        t0 = time.monotonic()
        with table.index_lock() if config.use_lock else nullcontext():
            t1 = time.monotonic()
            summary.lock_wait_s += t1 - t0
            committed_before = summary.preempted_commits
            catchup = _to_restore(table)
            if catchup:
                _record_pending(table, catchup)
            try:
                more = _round(table, config, execute, summary)
            finally:
                _restore_catchup(table, catchup, config.use_lock)
            if config.use_lock:
                summary.lock_held_s += time.monotonic() - t1
        summary.rounds += 1
        if summary.preempted_commits > committed_before:
            refused += 1
            if refused >= config.max_attempts:
                summary.error = f"compaction of {uri} preempted {refused} times by concurrent commits"
                log.warning("%s; the next run plans again", summary.error)
                break
        if not more:
            break
    after = table.refresh().dataset
    summary.table_version_after = after.version
    health_after = fragment_health(after, config.target_rows_per_fragment)
    summary.health_after = health_after.to_dict()
    if config.enabled and summary.due and due_reasons(health_after, config):
        from memwal.index_segments import blocking_indexes

        summary.blocked_by_index_segments, summary.blocked_by_unindexed_fragments = blocking_indexes(
            after, config.target_rows_per_fragment)
        if summary.blocked_by_index_segments:
            log.warning("compaction of %s is still due but Lance cannot combine fragments covered by different "
                        "segments of indexes %s (index: segments); a catch-up with a bounded index policy folds "
                        "them", uri, summary.blocked_by_index_segments)
        if summary.blocked_by_unindexed_fragments:
            log.warning("compaction of %s is still due but Lance does not combine indexed fragments with fragments "
                        "indexes %s do not cover yet (index: fragments); the next catch-up covers them (the "
                        "maintenance DAG runs catch-up before compaction)", uri, summary.blocked_by_unindexed_fragments)
    summary.duration_s = time.monotonic() - started
    log.info("compaction of %s: %s; %d tasks committed in %d rounds (%d preempted), fragments %d -> %d",
             uri, "; ".join(summary.due) or "not due", summary.tasks_committed, summary.rounds,
             summary.tasks_preempted, summary.health_before["fragments"], summary.health_after["fragments"])
    return summary
