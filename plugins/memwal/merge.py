"""Merge: flushed generations of the regions go into the base table with Lance merge-insert.

Per region, the generations above merged_generations[region] are merged in ascending order, several
consecutive ones per commit, where per key the highest generation wins and, within a generation, the
later row. One commit may carry the batches of several regions (primary keys belong to one region, so
their rows never meet). A commit is a delete pass and an upsert pass that carries every region's
merged_generations marker (`mark_sstables_as_compacted`, one marker per region; upserts first when every
region's tombstones allow it, both passes then marked), so progress can never claim data that is not there;
why two passes, their order and why they are safe: memwal.merge_commit.
Each region batch stays within a generation count and each commit within a byte budget (`MergeConfig`). When a racing
merger got there first, Lance refuses the whole commit (a stale marker of any of its regions); we reload
the MemWAL index and plan again from what is really merged (memwal-spec.txt, Appendix 2), so the other
regions of that commit are neither lost nor applied twice.

The dedup is a hook (`Dedup`): one region batch in, a `MergeInput` out (in process: `local_dedup`, called
right before its commit, so memory follows one commit). A hook may also offer `.batch(batches, ...)`, which
dedups every region batch of a round at once (Spark: one distributed job) and returns one `MergeInput` (or
the exception of that batch) per batch.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import Enum

import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN, newest_per_key
from memwal.errors import CommitConflictError, LeaseLostError, LockTimeoutError, MemWalError, MissingGenerationError
from memwal.faults import fault_point
from memwal.generation import open_generation
from memwal.job_config import MergeConfig
from memwal.mem_wal_index import load_index
from memwal.memory import release_unused
from memwal.merge_apply import Apply, choose_apply, passes, read_staged, stage_upserts
from memwal.merge_commit import CommitPasses, Overtaken
from memwal.planning import leading_batch
from memwal.region_manifest import load_latest_manifest, select_regions
from memwal.schema import conform_to
from memwal.storage import ObjectStore
from memwal.table import MemWalTable, TableLike
from memwal.task_runner import TaskRunner

__all__ = [
    "GenerationRef",
    "MergeConfig",
    "MergeInput",
    "MergeSummary",
    "RegionMergeResult",
    "RegionProgress",
    "local_dedup",
    "merge_table",
    "pending_generations",
    "plan_batch",
    "plan_commits",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRef:
    """One flushed generation to merge."""

    region_id: str
    generation: int
    path: str  # directory name relative to the region directory
    uri: str
    nbytes: int


@dataclass
class MergeInput:
    """What one region batch contributes to a commit: upserts and deleted keys.

    open_upserts() is called once per commit attempt and returns the upserts as a table, never a stream:
    Lance then plans the merge-insert join with exact statistics, and with a by-source delete its memory
    over a stream grows with the base table (spark_jobs/merge_dedup.py has the measurement).
    """

    open_upserts: Callable[[], pa.Table]
    deleted_keys: pa.Table
    rows_read: int = 0
    cleanup: Callable[[], None] = lambda: None
    # where the upserts are staged (Arrow IPC files in the base schema, paths in the table's store), if
    # they are: the fragment apply's tasks then read them there and the driver holds their keys only
    staged: tuple[str, ...] = ()
    staged_rows: int = 0
    # deleted keys staged as Arrow IPC files as well (the Spark dedup's, beside its upserts; `deleted_keys`
    # holds the others, often none): the scan path's tasks read them there, the other paths on the driver
    staged_deleted: tuple[str, ...] = ()
    staged_deleted_rows: int = 0
    # per region: the lowest generation holding a winning upsert and a winning tombstone (None: none); it
    # tells which pass may carry the batch's first marker step (`merge_commit.plan_passes`); a region it
    # lacks is taken as unknown (the default order)
    winners: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    @property
    def deleted_rows(self) -> int:
        return self.deleted_keys.num_rows + self.staged_deleted_rows

    def open_deleted(self, store: ObjectStore) -> pa.Table:
        """Every deleted key as one table: `deleted_keys` and the staged files (read here)."""
        if not self.staged_deleted:
            return self.deleted_keys
        schema = self.deleted_keys.schema
        staged = [read_staged(store, p).select(schema.names).cast(schema)
                  for p in self.staged_deleted]
        return pa.concat_tables([self.deleted_keys, *staged])


Dedup = Callable[[Sequence[GenerationRef], list[str], pa.Schema, ObjectStore], MergeInput]


@dataclass
class RegionMergeResult:
    region_id: str
    merged_generation_before: int = 0
    merged_generation_after: int = 0
    generations: list[int] = field(default_factory=list)
    rows_read: int = 0
    rows_upserted: int = 0
    rows_deleted: int = 0
    bytes_read: int = 0
    commits: int = 0
    conflicts: int = 0
    generations_merged_by_others: int = 0
    duration_s: float = 0.0
    error: str | None = None


@dataclass
class MergeSummary:
    table_uri: str
    table_version_before: int = 0
    table_version_after: int = 0
    regions: list[RegionMergeResult] = field(default_factory=list)
    duration_s: float = 0.0
    table_commits: int = 0  # Lance commits made; `commits` counts region batches (one per region per commit)
    timings_s: dict[str, float] = field(default_factory=dict)  # plan / dedup / commit, summed over the run

    @property
    def commits(self) -> int:
        return sum(r.commits for r in self.regions)

    @property
    def failed_regions(self) -> list[str]:
        return [r.region_id for r in self.regions if r.error]

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            job="merge",
            commits=self.commits,
            generations_merged=sum(len(r.generations) for r in self.regions),
            rows_upserted=sum(r.rows_upserted for r in self.regions),
            rows_deleted=sum(r.rows_deleted for r in self.regions),
            bytes_read=sum(r.bytes_read for r in self.regions),
            failed_regions=self.failed_regions,
        )
        return out


def _generation_bytes(store: ObjectStore, region_id: str, path: str) -> int:
    return sum(m.size for m in store.list(f"{naming.generation_dir(region_id, path)}/data"))


def pending_generations(table: MemWalTable, region_id: str, merged_generation: int) -> list[GenerationRef]:
    """Flushed generations above merged_generation, ascending; they must be consecutive.

    merged_generation was read before the manifest: if a merge and a GC ran in between, the generations
    just above it are already merged and pruned from the manifest. That is a race, not a gap: the index is
    reloaded and the pending list starts from what is really merged. Only a generation still missing after
    the reload is refused (a load of its own: planning threads share the handle).
    """
    store = table.store
    manifest = load_latest_manifest(store, region_id)
    pending = sorted(
        (fg for fg in manifest.flushed_generations if fg.generation > merged_generation),
        key=lambda fg: fg.generation,
    )
    if pending and pending[0].generation > merged_generation + 1:
        reloaded = load_index(table.uri, table.storage_options).details.merged_generation(region_id)
        if reloaded > merged_generation:
            log.info("region %s: generations up to %d were merged meanwhile; continuing from there",
                     region_id, reloaded)
            return pending_generations(table, region_id, reloaded)
    expected = merged_generation + 1
    refs = []
    for fg in pending:
        if fg.generation != expected:
            raise MemWalError(
                f"region {region_id}: generation {expected} is not in the region manifest "
                f"(merged up to {merged_generation}, next listed {fg.generation}); refusing to skip it"
            )
        rel = naming.generation_dir(region_id, fg.path)
        refs.append(
            GenerationRef(region_id, fg.generation, fg.path, store.uri_of(rel),
                          _generation_bytes(store, region_id, fg.path))
        )
        expected += 1
    return refs


def plan_batch(pending: Sequence[GenerationRef], config: MergeConfig) -> list[GenerationRef]:
    """The first consecutive generations that fit one commit (always at least one)."""
    n = leading_batch([r.nbytes for r in pending], config.max_generations_per_commit, config.max_bytes_per_commit)
    return list(pending[:n])


def plan_commits(
    pending: Sequence[Sequence[GenerationRef]], config: MergeConfig, regions_per_commit: int | None = None
) -> list[list[list[GenerationRef]]]:
    """Commits (each a list of region batches) for the pending generations of several regions.

    Each region is cut into batches exactly as if it were merged alone (`plan_batch`: the generation count
    and the byte budget per batch). Regions in the given order, each region's batches ascending, every batch
    joins the first commit after its region's previous batch that stays within the byte budget (what the
    commit holds; a commit's first batch always fits) and the regions_per_commit limit, else a new commit.
    The generation count is per region batch, not summed over the commit: a commit's Lance commits follow
    its longest batch (one marker step per generation, memwal.merge_commit), not its region count, so 64
    regions of 2 small generations are one commit, not 16, and 3 regions of 2 generations at a count of 1
    are two commits, each carrying every region (issue 44). At most max_commits_per_round commits (a
    region's batches beyond them wait for the next round).
    """
    commits: list[list[list[GenerationRef]]] = []
    loads: list[int] = []
    limit = regions_per_commit or 1 << 30
    for refs in pending:
        rest, after = list(refs), 0
        while rest:
            batch = plan_batch(rest, config)
            rest = rest[len(batch):]
            size = sum(r.nbytes for r in batch)
            c = after  # commits before `after` hold this region's earlier batches (or precede them)
            while c < len(commits) and (loads[c] + size > config.max_bytes_per_commit or len(commits[c]) >= limit):
                c += 1
            if c == len(commits):
                if len(commits) >= config.max_commits_per_round:
                    break
                commits.append([])
                loads.append(0)
            commits[c].append(batch)
            loads[c] += size
            after = c + 1
    return commits


def read_generation(ref: GenerationRef, store: ObjectStore) -> pa.Table:
    """A generation's rows with _tombstone, GEN_COLUMN and ROWADDR_COLUMN."""
    ds = open_generation(store, ref.region_id, ref.generation, ref.path)
    t = ds.to_table(with_row_address=True)
    t = t.append_column(GEN_COLUMN, pa.array([ref.generation] * t.num_rows, pa.int64()))
    return t.rename_columns([ROWADDR_COLUMN if c == "_rowaddr" else c for c in t.column_names])


def split_winners(winners: pa.Table, pk: list[str], schema: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """(upserts in the base schema, deleted keys) from the newest version of each key."""
    tomb = winners.column(naming.TOMBSTONE_COLUMN)
    # a generation flushed before a column was added lacks it: null, as Lance core's readers see it
    upserts = conform_to(winners.filter(pc.invert(tomb)), schema)
    deletes = winners.filter(tomb).select(pk)
    return upserts, deletes


def lowest_winners(winners: pa.Table) -> tuple[int | None, int | None]:
    """The lowest generation holding a winning upsert and a winning tombstone (None: there is none), from
    the newest version of each key (`MergeInput.winners`)."""
    tomb, gen = winners.column(naming.TOMBSTONE_COLUMN), winners.column(GEN_COLUMN)
    up, down = pc.min(pc.filter(gen, pc.invert(tomb))).as_py(), pc.min(pc.filter(gen, tomb)).as_py()
    return up, down


def dedup_batch(tables: Sequence[pa.Table], pk: list[str],
                schema: pa.Schema) -> tuple[pa.Table, pa.Table, int, tuple[int | None, int | None]]:
    """`dedup_generations`, and the batch's `lowest_winners`."""
    rows = pa.concat_tables(tables, promote_options="permissive")
    winners = newest_per_key(rows, pk)
    upserts, deletes = split_winners(winners, pk, schema)
    return (upserts, deletes.cast(pa.schema([schema.field(c) for c in pk])), rows.num_rows,
            lowest_winners(winners))


def dedup_generations(tables: Sequence[pa.Table], pk: list[str], schema: pa.Schema) -> tuple[pa.Table, pa.Table, int]:
    """(upserts, deleted keys, rows read) of one region batch's generation tables (from read_generation)."""
    return dedup_batch(tables, pk, schema)[:3]


def local_dedup(refs: Sequence[GenerationRef], pk: list[str], schema: pa.Schema, store: ObjectStore) -> MergeInput:
    """In-process dedup with pyarrow (the library path; the Spark job supplies its own)."""
    upserts, deletes, n, lowest = dedup_batch([read_generation(r, store) for r in refs], pk, schema)
    return MergeInput(lambda: upserts, deletes, n, winners={refs[0].region_id: lowest})


def _is_stale_marker(exc: BaseException) -> bool:
    """Another merger got there first: Lance refused our marker, or a pass saw progress move (replan)."""
    return isinstance(exc, Overtaken) or "Stale SSTable compaction" in str(exc)


def _commit(table: MemWalTable, markers: Sequence[tuple[str, int]], data: MergeInput,
            since: Mapping[str, int] | None = None, apply: Apply = passes) -> CommitPasses:
    """One commit of upserts + deletes + one marker per region, under the MemWAL index lock, held across
    both passes (memwal.merge_commit); the handle moves to the version committed. since: each region's
    merged generation the plan started from (a pass refuses to run once it moved); without it, the
    generation below its marker. Lance refuses the commit as a whole when any marker is stale. apply: the
    two passes, or the fragment apply (memwal.merge_apply)."""
    if since is None:
        since = {r: g - 1 for r, g in markers}
    with table.index_lock():
        return apply(table, markers, since, data)


# --- the merge loop ---------------------------------------------------------------------------------


class _Once:
    """A MergeInput's cleanup, run at most once."""

    def __init__(self, data: MergeInput):
        self.data, self.done = data, False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.data.cleanup()


class _Combined:
    """Several regions' MergeInputs as one commit's input; counts the upserts of each region.

    When any part is staged (the Spark dedup's), the commit stays staged: the inline parts' upserts (small
    batches the dedup returned in memory) are written beside them as one more staged file, so the fragment
    apply's tasks read files and the driver never opens a staged part. `cleanup()` deletes that file (a
    crash's leftover is an abandoned staging directory for GC)."""

    def __init__(self, parts: Sequence[MergeInput], schema: pa.Schema, pk: list[str], store: ObjectStore | None = None):
        self.parts = list(parts)
        self.upserted = [0] * len(self.parts)
        self.store, self.scratch = store, None
        keys = [p.deleted_keys for p in self.parts]
        staged = store is not None and any(p.staged for p in self.parts)
        files: tuple[str, ...] = ()
        if staged:  # the fragment apply reads them where they are staged (counted as staged)
            inline = {i: p.open_upserts() for i, p in enumerate(self.parts) if not p.staged}
            self.upserted = [inline[i].num_rows if i in inline else p.staged_rows for i, p in enumerate(self.parts)]
            files = tuple(f for p in self.parts for f in p.staged)
            rows = [t for t in inline.values() if t.num_rows]
            if rows:
                together = pa.concat_tables([t.select(schema.names).cast(schema) for t in rows])
                self.scratch = f"{naming.STAGING_DIR}/merge-inline-{uuid.uuid4().hex}"
                files += (stage_upserts(store, together, self.scratch),)
        self.input = MergeInput(self.open, pa.concat_tables(keys, promote_options="permissive") if keys
                                else schema.empty_table().select(pk), sum(p.rows_read for p in self.parts),
                                staged=files, staged_rows=sum(self.upserted) if staged else 0,
                                staged_deleted=tuple(f for p in self.parts for f in p.staged_deleted),
                                staged_deleted_rows=sum(p.staged_deleted_rows for p in self.parts),
                                winners={r: w for p in self.parts for r, w in p.winners.items()})

    def open(self) -> pa.Table:
        opened = [p.open_upserts() for p in self.parts]
        self.upserted = [o.num_rows for o in opened]
        return pa.concat_tables(opened, promote_options="permissive")

    def cleanup(self) -> None:
        """Delete the staged file of the inline parts, if one was written."""
        if self.scratch is not None:
            path, self.scratch = self.scratch, None
            try:
                self.store.delete_prefix(path)
            except OSError as exc:  # a leftover staged file is garbage (GC of staging), not an error of the merge
                log.warning("could not delete the staged upserts %s: %s", path, exc)


class _Round:
    """The dedup of one round's region batches: all at once when the hook has `.batch` (else lazily, one
    commit at a time); every MergeInput made is cleaned up once (after its commit attempt, or at the end)."""

    def __init__(self, dedup: Dedup, commits: list[list[list[GenerationRef]]], pk, schema, store: ObjectStore,
                 timings: dict[str, float], threads: int = 1):
        self.dedup, self.commits, self.pk, self.schema, self.store = dedup, commits, pk, schema, store
        self.timings, self.threads = timings, threads
        self.made: list[_Once] = []
        self.ready: dict[tuple[int, int], MergeInput | BaseException] | None = None

    def _timed(self, fn, *args):
        started = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.timings["dedup"] = self.timings.get("dedup", 0.0) + time.monotonic() - started

    def _batch_all(self) -> None:
        self.ready = {}
        batch_fn = getattr(self.dedup, "batch", None)
        if batch_fn is None:
            return
        keys = [(c, b) for c, commit in enumerate(self.commits) for b in range(len(commit))]
        try:
            results = self._timed(batch_fn, [self.commits[c][b] for c, b in keys], self.pk, self.schema, self.store)
        except Exception as exc:  # the hook could not tell which batch failed: dedup them one by one
            log.warning("the batch dedup of %d region batches failed (%s); deduplicating them one by one",
                        len(keys), exc)
            return
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, MergeInput):
                self.made.append(_Once(result))
            self.ready[key] = result

    def _one(self, refs: Sequence[GenerationRef]) -> MergeInput | BaseException:
        try:
            return self.dedup(refs, self.pk, self.schema, self.store)
        except (MemWalError, MissingGenerationError, OSError) as exc:
            return exc

    def inputs(self, c: int) -> list[MergeInput | BaseException]:
        """One MergeInput (or the exception of its dedup) per region batch of commit c. The in-process dedup
        of a commit's region batches runs in `threads` threads (Lance's reads and pyarrow's kernels release
        the GIL: 64 regions' generations are read side by side); a hook of the caller's runs one by one."""
        if self.ready is None:
            self._batch_all()
        batches = self.commits[c]
        todo = [b for b in range(len(batches)) if (c, b) not in self.ready]
        threads = min(self.threads, len(todo)) if self.dedup is local_dedup else 1
        started = time.monotonic()
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="memwal-dedup") as pool:
                done = dict(zip(todo, pool.map(lambda b: self._one(batches[b]), todo), strict=True))
        else:
            done = {b: self._one(batches[b]) for b in todo}
        if todo:
            self.timings["dedup"] = self.timings.get("dedup", 0.0) + time.monotonic() - started
        out: list[MergeInput | BaseException] = []
        for b in range(len(batches)):
            result = self.ready.pop((c, b)) if b not in done else done[b]
            if b in done and isinstance(result, MergeInput):
                self.made.append(_Once(result))
            out.append(result)
        return out

    def cleanup(self, data: MergeInput | None = None) -> None:
        """Clean up one input (after its commit attempt) or all that are left; forget them, so that a
        round holds no more than its current commit's upserts."""
        keep = []
        for once in self.made:
            if data is None or once.data is data:
                once()
            else:
                keep.append(once)
        self.made = keep


def _pending_all(table: MemWalTable, merged: dict[str, int], up_to_generation: int | None,
                 config: MergeConfig) -> dict[str, list[GenerationRef] | BaseException]:
    """Pending generations of every region (manifests read in parallel), or the region's error."""

    def one(region_id: str) -> list[GenerationRef] | BaseException:
        try:
            pending = pending_generations(table, region_id, merged[region_id])
        except (MemWalError, MissingGenerationError, OSError) as exc:
            return exc
        if up_to_generation is not None:
            pending = [r for r in pending if r.generation <= up_to_generation]
        return pending

    regions = list(merged)
    if len(regions) <= 1 or config.planning_threads <= 1:
        return {r: one(r) for r in regions}
    with ThreadPoolExecutor(min(config.planning_threads, len(regions)), thread_name_prefix="memwal-plan") as pool:
        return dict(zip(regions, pool.map(one, regions), strict=True))


@dataclass
class RegionProgress:
    """One region's way through a merge: its result so far (generations merged, counts, merged up to), the
    attempts at the batch it is stuck on, and the error that ended it (a region with an error is done)."""

    result: RegionMergeResult
    started: float = field(default_factory=time.monotonic)
    attempts: int = 0
    error: BaseException | None = None

    @property
    def region_id(self) -> str:
        return self.result.region_id

    def observe(self, merged: int, first: bool) -> None:
        """What the MemWAL index says is merged at the start of a round (a racing merger may have moved it)."""
        if first:
            self.result.merged_generation_before = merged
        self.result.merged_generation_after = max(self.result.merged_generation_after, merged)

    def fail(self, exc: BaseException) -> None:
        log.error("region %s: merge failed: %s", self.region_id, exc)
        self.error = exc

    def retry(self, refs: Sequence[GenerationRef], exc: BaseException, what: str, max_attempts: int) -> None:
        """Count a refused or overtaken attempt at these generations; the region fails at max_attempts."""
        self.result.conflicts += 1
        self.attempts += 1
        if self.attempts >= max_attempts:
            gens = [r.generation for r in refs]
            self.fail(CommitConflictError(
                f"region {self.region_id}: merge of generations {gens} {what} {self.attempts} times: {exc}"))

    def landed(self, refs: Sequence[GenerationRef], data: MergeInput, upserted: int) -> None:
        """A commit carrying this region's batch `refs` landed: its marker is at refs[-1]."""
        res, gens = self.result, [r.generation for r in refs]
        res.generations += gens
        res.rows_read += data.rows_read
        res.rows_upserted += upserted
        res.rows_deleted += data.deleted_rows
        res.bytes_read += sum(r.nbytes for r in refs)
        res.commits += 1
        res.merged_generation_after = gens[-1]
        log.info("region %s: merged generations %d..%d (%d upserts, %d deletes)",
                 res.region_id, gens[0], gens[-1], upserted, data.deleted_rows)

    def finish(self) -> RegionMergeResult:
        res = self.result
        res.generations_merged_by_others = res.merged_generation_after - res.merged_generation_before - len(
            res.generations)
        res.duration_s = time.monotonic() - self.started
        return res


class _Outcome(Enum):
    """How a commit step (or a round of them) ended."""

    COMMITTED = "committed"  # its commit landed (a round: every commit landed)
    REPLAN = "replan"  # refused, overtaken or failed: reload the index and plan again
    STOPPED = "stopped"  # the MemWAL index lock was not ours in time, or our lease was lost: the run ends


class _MergeRun:
    """A merge across its rounds: each region's progress, the Lance commits made, time per phase."""

    def __init__(self, table: MemWalTable, region_ids: Sequence[str], config: MergeConfig, apply: Apply,
                 timings: dict[str, float], results: dict[str, RegionMergeResult]):
        results.update({r: RegionMergeResult(r) for r in region_ids})
        self.regions = {r: RegionProgress(results[r]) for r in region_ids}
        self.table, self.config, self.apply, self.timings = table, config, apply, timings
        self.table_commits = 0
        self.regions_per_commit: int | None = None  # 1 after a commit of several regions failed for another reason
        self.rounds = 0
        self.freed = False  # a commit landed since memory was last given back (`_merge_round`)

    def active(self) -> list[str]:
        """The regions still merging, in the order given."""
        return [r for r, p in self.regions.items() if p.error is None]

    def add_time(self, key: str, since: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + time.monotonic() - since

    def plan(self, up_to_generation: int | None) -> list[list[list[GenerationRef]]]:
        """The next round's commits, from what the MemWAL index says is merged now."""
        t0 = time.monotonic()
        details = self.table.refresh().details
        merged = {r: details.merged_generation(r) for r in self.active()}
        for r, generation in merged.items():
            self.regions[r].observe(generation, first=self.rounds == 0)
        self.rounds += 1
        pending = _pending_all(self.table, merged, up_to_generation, self.config)
        for r, got in pending.items():
            if isinstance(got, BaseException):
                self.regions[r].fail(got)
        plan = [got for got in pending.values() if not isinstance(got, BaseException) and got]
        commits = plan_commits(plan, self.config, self.regions_per_commit)
        self.add_time("plan", t0)
        return commits

    def unread(self, failed: Sequence[tuple[list[GenerationRef], BaseException]]) -> None:
        """Region batches whose dedup failed: the region fails, unless another merger merged those generations
        since we planned them (and GC may have collected them, which is why the read failed): like a stale
        marker, that is retried."""
        now = self.table.refresh().details
        for refs, exc in failed:
            progress = self.regions[refs[0].region_id]
            if now.merged_generation(progress.region_id) < refs[0].generation:
                progress.fail(exc)
                continue
            log.info("region %s: generations %s were merged by another merger while we read them (%s); reloading",
                     progress.region_id, [r.generation for r in refs], exc)
            progress.retry(refs, exc, "overtaken", self.config.max_attempts)

    def refused(self, batches: Sequence[list[GenerationRef]], exc: OSError) -> None:
        """A commit failed: every region of it retries; one refused for another reason than a stale marker
        is retried region by region, so one region's failure stays its own."""
        stale = _is_stale_marker(exc)
        if not stale and len(batches) > 1:
            self.regions_per_commit = 1
        for refs in batches:
            self.regions[refs[0].region_id].retry(refs, exc, "failed", self.config.max_attempts)
        regions = ", ".join(refs[0].region_id for refs in batches)
        if stale:
            log.info("merge commit for region(s) %s refused: another merger got there first; reloading", regions)
        else:
            log.warning("merge commit for region(s) %s failed (%s); retrying", regions, exc)

    def stop(self, later: Sequence[list[list[GenerationRef]]], exc: LockTimeoutError | LeaseLostError) -> None:
        """Another job held the MemWAL index lock longer than we wait (a long compaction round), or took it
        over after we stalled past our lease: this commit and the rest of the round are not made, their
        regions fail with `exc`; the commits made so far stay ours and their regions' results stand. A lease
        lost between the steps of this commit (memwal.merge_commit) leaves its regions merged part of the
        way: their merged_generation_after is read back from the MemWAL index."""
        if isinstance(exc, LeaseLostError) and later:
            self.observe_index([refs[0].region_id for refs in later[0]])
        for refs in (refs for commit in later for refs in commit):
            progress = self.regions[refs[0].region_id]
            if progress.error is None:
                progress.fail(exc)

    def observe_index(self, region_ids: Sequence[str]) -> None:
        """What the MemWAL index records as merged now, for these regions (best effort: a failed read is
        logged and changes nothing)."""
        try:
            details = self.table.refresh().details
        except (MemWalError, OSError) as exc:
            log.warning("could not read back what the MemWAL index records as merged: %s", exc)
            return
        for r in region_ids:
            self.regions[r].observe(details.merged_generation(r), first=False)

    def landed(self, batches: Sequence[list[GenerationRef]], inputs: Sequence[MergeInput], upserted: Sequence[int],
               done: CommitPasses) -> None:
        self.table_commits += done.table_commits
        for key, seconds in done.timings_s.items():
            self.timings[key] = self.timings.get(key, 0.0) + seconds
        for refs, data, n in zip(batches, inputs, upserted, strict=True):
            self.regions[refs[0].region_id].landed(refs, data, n)

    def finish(self) -> tuple[dict[str, RegionMergeResult], dict[str, BaseException], int]:
        results = {r: p.finish() for r, p in self.regions.items()}
        errors = {r: p.error for r, p in self.regions.items() if p.error is not None}
        return results, errors, self.table_commits


def _commit_step(run: _MergeRun, rnd: _Round, c: int, later: Sequence[list[list[GenerationRef]]]) -> _Outcome:
    """Commit c of a round: its region batches deduplicated, then one commit of their data and one marker per
    region (`_commit`); each input cleaned up after the attempt. `later`: this commit and the round's rest."""
    batches, inputs = rnd.commits[c], rnd.inputs(c)
    failed = [(refs, x) for refs, x in zip(batches, inputs, strict=True) if isinstance(x, BaseException)]
    if failed:
        run.unread(failed)
        return _Outcome.REPLAN
    markers = [(refs[0].region_id, refs[-1].generation) for refs in batches]
    log.info("merge of %s read and deduplicated; committing (under the MemWAL index lock)",
             ", ".join(f"region {r} up to generation {g}" for r, g in markers))
    since = {refs[0].region_id: refs[0].generation - 1 for refs in batches}
    fault_point("merge.before_commit")
    t1 = time.monotonic()
    combined = _Combined(inputs, rnd.schema, rnd.pk, rnd.store) if len(batches) > 1 else None
    try:
        done = _commit(run.table, markers, inputs[0] if combined is None else combined.input, since, run.apply)
        upserted = [done.upserted] if combined is None else combined.upserted
    except (LockTimeoutError, LeaseLostError) as exc:  # the run ends; what landed before stays reported
        run.stop(later, exc)
        return _Outcome.STOPPED
    except OSError as exc:
        run.refused(batches, exc)
        return _Outcome.REPLAN
    finally:
        for x in inputs:
            rnd.cleanup(x)
        if combined is not None:
            combined.cleanup()
        run.add_time("commit", t1)
    fault_point("merge.after_commit")
    run.landed(batches, inputs, upserted, done)
    return _Outcome.COMMITTED


def _merge_round(run: _MergeRun, commits: list[list[list[GenerationRef]]], dedup: Dedup) -> _Outcome:
    """The commits of one round, in order, until one does not land; the round's inputs cleaned up. What a
    landed commit freed goes back to the OS before the next commit reads its generations (the footprint
    follows one commit), not after the run's last commit, where the next work reuses it (a malloc_trim of
    5-7 ms at 8M rows, bench/README.md issue 44)."""
    table = run.table
    rnd = _Round(dedup, commits, table.primary_key, table.schema, table.store, run.timings,
                 run.config.planning_threads)
    try:
        for c in range(len(commits)):
            if run.freed:
                release_unused()  # the commits before this one landed: their upserts are not needed any more
                run.freed = False
            outcome = _commit_step(run, rnd, c, commits[c:])
            if outcome is not _Outcome.COMMITTED:
                return outcome
            run.freed = True
        return _Outcome.COMMITTED
    finally:
        rnd.cleanup()


def _merge_regions(
    table: MemWalTable,
    region_ids: Sequence[str],
    config: MergeConfig,
    dedup: Dedup,
    up_to_generation: int | None,
    timings: dict[str, float],
    results: dict[str, RegionMergeResult] | None = None,
    apply: Apply | None = None,
) -> tuple[dict[str, RegionMergeResult], dict[str, BaseException], int]:
    """Merge the regions; (results, errors by region, Lance commits made). `results`, if given, is filled in
    as commits land, so the caller keeps what was committed even if this raises. Rounds go on while one
    was replanned, or filled max_commits_per_round."""
    run = _MergeRun(table, region_ids, config, apply or choose_apply(config.apply), timings,
                    {} if results is None else results)
    while run.active():
        commits = run.plan(up_to_generation)
        if not commits:
            break
        outcome = _merge_round(run, commits, dedup)
        if outcome is _Outcome.STOPPED or (outcome is _Outcome.COMMITTED
                                          and len(commits) < config.max_commits_per_round):
            break
    return run.finish()


def merge_table(
    table: TableLike,
    regions: Sequence[str] | None = None,
    config: MergeConfig | None = None,
    dedup: Dedup = local_dedup,
    up_to_generation: int | None = None,
    runner: TaskRunner | None = None,
    parallelism: int = 1,
) -> MergeSummary:
    """Merge all regions (or the given ones), each up to up_to_generation if given, several regions per
    commit. A region that fails is reported, the others still run. Giving up on the MemWAL index lock
    (LockTimeoutError) or losing our lease on it (LeaseLostError) ends the run: the regions still to commit
    are reported failed with it, and what was committed stays in the summary (those regions are not failed).
    runner / parallelism: where the fragment apply's tasks run and how many (`config.apply`,
    `memwal.merge_apply.choose_apply`)."""
    table = MemWalTable.of(table)
    config = config or MergeConfig()
    apply = choose_apply(config.apply, runner, parallelism)
    started = time.monotonic()
    summary = MergeSummary(table.uri, table_version_before=table.refresh().index.table_version)
    selected = select_regions(table.store, regions)
    good = [r for r, problem in selected if not problem]
    results: dict[str, RegionMergeResult] = {}
    errors: dict[str, BaseException] = {}
    if good:
        try:
            _, errors, summary.table_commits = _merge_regions(
                table, good, config, dedup, up_to_generation, summary.timings_s, results, apply)
        except (MemWalError, MissingGenerationError, OSError) as exc:  # the table itself (schema, key)
            log.error("merge failed: %s", exc)
            errors = dict.fromkeys(good, exc)  # what was committed before stays in `results`
    for region_id, problem in selected:
        if problem:
            summary.regions.append(RegionMergeResult(region_id, error=problem))
        elif region_id in errors:
            res = results.get(region_id) or RegionMergeResult(region_id)
            res.error = str(errors[region_id])
            summary.regions.append(res)
        else:
            summary.regions.append(results[region_id])
    try:
        summary.table_version_after = table.refresh().version
    except OSError as exc:  # a store still failing: keep what committed and each region's own error (issue 42)
        if not summary.failed_regions:
            raise
        summary.table_version_after = table.version  # the newest this handle saw
        log.warning("merge: could not read the table version after the merge: %s", exc)
    summary.duration_s = time.monotonic() - started
    return summary
