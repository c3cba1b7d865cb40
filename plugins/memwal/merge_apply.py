"""One merge commit applied fragment by fragment: locate the base rows of the backlog's keys, write
deletion vectors and new fragments in tasks (`memwal.task_runner.TaskRunner`), commit once on the driver.

The three steps (STYLE: plan on the driver, tasks own disjoint work and return metadata, one commit), on
one of two paths, by the two passes' measured rule (`merge_commit.use_index`: the backlog's keys against
the table's rows):

- **lookup path** (a backlog small against the table): the backlog's keys (upserts and deleted keys),
  sorted, are cut into slices; a task per slice looks their `_rowaddr` up at the planned version v with
  batched `key IN (...)` scans (the key's scalar index serves them) and returns (key, address) pairs
  (address = fragment id << 32 | offset); the driver deals the touched fragments to tasks (balanced by
  rows), each writing its fragments' deletion vectors (`LanceFragment.delete_rows`, no rescan) and its share
  of the replacement rows as new fragments (`lance.fragment.write_fragments`). Upserts staged as files
  (`MergeInput.staged`, the Spark dedup's) are read by the tasks; the driver keeps their keys only.
- **scan path** (a large backlog): the fragments are cut into runs in fragment order, a task each
  (`scan_apply`): it reads the commit's upserts (staged files; inline ones are first written once to a
  scratch file: a task's input is paths, never rows) and deleted keys, scans its
  fragments' key column once for them, writes the deletion vectors and the replacement rows of what it
  found there, and the found keys to a scratch file; the driver holds no upsert and no upsert key. Counts and
  key fingerprints tell whether every upsert was found exactly once; if not, a second round
  (`fresh_upserts`) writes the fresh upserts for the marker commit and refuses a key found twice.

**commit**: one `LanceOperation.Update` (removed, updated and new fragments) with read_version = v, then the
**marker commit**: a merge-insert of the backlog's fresh keys (upserts found nowhere in the base) carrying
the first marker step of every region (`merge_commit.marker_steps`: since+1), then a marker-only commit per
further generation of the batch (`merge_commit.advance_markers`). pylance 14's `Update` cannot carry the
marker (LANCE-MAINTENANCE-NOTES), so the marker follows the data, as the two-pass merge's upsert pass
follows its delete pass; stepping one generation at a time is what makes that safe (merge_commit).

Why it is safe (tests/library/test_merge_apply.py and test_merge_window.py, tests/crash/, tests/concurrency/):
- Before the Update, progress is checked at the latest version (`Overtaken` unless every region is still
  at `since`) and our lease on the MemWAL index lock (`LeaseLostError`); Lance's own retry is not
  involved: a concurrent commit that touched any fragment we update (a compaction's Rewrite, a retention
  Delete, another merge's Update) makes Lance refuse the Update (fragment-level conflict, measured on
  pylance 14); nothing of ours is visible, we replan from the latest version (`APPLY_ATTEMPTS`).
- A merger that does not take our lock (or lost it) and commits after our check, before the Update or
  between any two of our commits: it merged generations since+1..G', so it moved the region to G' >=
  since+1 and our next marker step (since+1, or the step after the one it overtook) is refused by Lance
  as stale, or by our progress check (`Overtaken`): we replan from G', and the generations above G' are
  applied again, their newest rows over whatever older rows that merger wrote over ours. A key it wrote
  that our Update also replaced conflicts at the fragment level; a key our batch deleted and it
  re-inserted, or a fresh key both insert, are caught by the marker step. merged_generations never claims
  a generation whose newest rows the base does not hold.
- Between the Update and the last marker step, the base holds the batch's replacement rows and deletions
  while its generations above the recorded marker are still unmerged and shadow those keys with the same
  newest values: every reader's LSM view is exact (fresh keys are still read from the generations).
- A crash between them leaves that state; the rerun plans the remaining generations, finds the replaced
  keys at their new addresses and replaces them again with the same values, finds the deleted keys
  nowhere, and its marker commit inserts the fresh keys: the same table content, each step made once.
- A task that fails leaves only unreferenced files (Lance's cleanup removes them); the attempt raises
  `ApplyTaskError` (an OSError), which the merge loop retries like any failed commit.

Where the two-pass merge (`merge_commit.commit_passes`) is used instead: a composite key (no `IN` on a
tuple of columns), and tables with stable row ids: Lance's merge-insert keeps an updated row's `_rowid`
(measured), rows rewritten into new fragments would get new ids.
"""

from __future__ import annotations

import array
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.fragment import FragmentMetadata, write_fragments
from lance.mem_wal import CompactedSsTable

from memwal import naming
from memwal.faults import fault_point
from memwal.merge_commit import (
    CommitPasses,
    advance_markers,
    check_progress,
    commit_passes,
    marker_steps,
    run_pass,
    use_index,
)
from memwal.storage import ObjectStore, lance_storage_options
from memwal.table import MemWalTable
from memwal.task_runner import TaskRunner, in_process

__all__ = ["APPLY_ATTEMPTS", "Apply", "ApplyPlan", "ApplyTaskError", "MergeData", "apply_commit", "choose_apply",
           "passes", "plan_apply", "supports_apply"]

log = logging.getLogger(__name__)

APPLY_ATTEMPTS = 5  # Updates refused by a concurrent commit on our fragments before the commit fails
LOOKUP_KEYS = 16_384  # keys per `IN (...)` lookup: one scan through the key's index each
LOOKUP_TASK_KEYS = 262_144  # keys per lookup task
SCAN_CHUNK_ROWS = 4 * 1024 * 1024  # key-column rows matched at once, at most; and a scan task's run of fragments
SCAN_MIN_CHUNK_ROWS = 256 * 1024  # and at least, for integer keys (`_scan_addresses`)
SCAN_BATCH_ROWS = 128 * 1024  # rows per batch of the key-column scan (each batch a hand-off from Lance's threads)
ADDRESS = "_rowaddr"


class MergeData(Protocol):
    """What `memwal.merge.MergeInput` offers the apply (a protocol: merge imports this module)."""

    deleted_keys: pa.Table
    staged: tuple[str, ...]
    staged_rows: int
    staged_deleted: tuple[str, ...]

    @property
    def deleted_rows(self) -> int: ...

    def open_upserts(self) -> pa.Table: ...

    def open_deleted(self, store: ObjectStore) -> pa.Table: ...


class ApplyTaskError(OSError):
    """A lookup or apply task failed (an executor lost, a task raised): nothing was committed; retry."""


def is_update_conflict(exc: BaseException) -> bool:
    """Lance refused our Update: a concurrent commit touched fragments it updates."""
    text = str(exc)
    return "Retryable commit conflict" in text or "preempted by concurrent transaction" in text


def supports_apply(ds: lance.LanceDataset, pk: Sequence[str]) -> bool:
    """Whether this table takes the fragment apply (else the two passes): a one-column key, no stable
    row ids (see the module docstring)."""
    if len(pk) != 1:
        return False
    fragments = ds.get_fragments()
    return not (fragments and fragments[0].metadata.row_id_meta is not None)


# --- tasks (run wherever the TaskRunner runs them; only metadata comes back) ---------------------------

_open_cache: dict[tuple[str, int, int, str], lance.LanceDataset] = {}
_CACHED = 4  # datasets a process keeps open (a long-lived worker serves many jobs)


def content_id(ds: lance.LanceDataset) -> int:
    """What tells this version of the table from any other at the same URI and version number: the commit
    timestamp (ns) of its manifest (a table deleted and recreated gets new ones); 0 when pylance does not
    say, and then a task's dataset is never reused."""
    try:
        return int(ds._ds.current_version()["timestamp"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0


def options_digest(storage_options: Mapping[str, str] | None) -> str:
    """A digest of the caller's storage options: datasets opened with other credentials are not shared."""
    text = repr(sorted((str(k), str(v)) for k, v in (storage_options or {}).items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _dataset(table: MemWalTable, version: int, content: int = 0) -> lance.LanceDataset:
    """The base table at `version`, opened once per process for the same content (`content_id`, from the
    driver) and storage options: its index pages stay cached across the tasks of a job (and of later jobs
    on the same content). `table`: the handle a task carries (on an executor, unpickled: nothing open)."""
    if not content:
        return MemWalTable(table.uri, table.storage_options, version=version).dataset
    key = (table.uri, version, content, options_digest(table.storage_options))
    ds = _open_cache.get(key)
    if ds is None:
        opened = MemWalTable(table.uri, table.storage_options, version=version).dataset
        if content_id(opened) != content:  # recreated since the driver planned: not what it planned
            raise ApplyTaskError(f"table {table.uri}: version {version} is not the one the merge planned (the table "
                                 "was recreated); retrying")
        if len(_open_cache) >= _CACHED:
            _open_cache.pop(next(iter(_open_cache)))
        ds = _open_cache[key] = opened
    return ds


@dataclass(frozen=True)
class LookupTask:
    table: MemWalTable  # pickles to its URI and storage options
    version: int
    key: str
    keys: pa.Array  # sorted
    content: int = 0  # `content_id` of the version, from the driver


def lookup_addresses(task: LookupTask) -> pa.Table:
    """(key, _rowaddr) of the task's keys present in the base table at the version, through the key's
    index."""
    ds = _dataset(task.table, task.version, task.content)
    parts = []
    for start in range(0, len(task.keys), LOOKUP_KEYS):
        chunk = task.keys.slice(start, LOOKUP_KEYS)
        parts.append(ds.to_table(columns=[task.key], filter=pc.field(task.key).isin(chunk),
                                 with_row_address=True))
    if not parts:
        return pa.table({task.key: task.keys.slice(0, 0), ADDRESS: pa.array([], pa.uint64())})
    return pa.concat_tables(parts).select([task.key, ADDRESS])


class _KeyRuns:
    """Integer keys as runs in ascending order (one per staged file, as the dedup wrote it, and the deleted
    keys; a run out of order is sorted here): the keys within [lo, hi] are two binary searches per run away,
    so a task handles the keys of its own fragments' range, not every key of the backlog."""

    def __init__(self, runs: Sequence[np.ndarray]):
        self.runs = [r for r in runs if len(r)]

    def count(self, lo: int, hi: int) -> int:
        return sum(e - s for _, s, e in self._slices(lo, hi))

    def within(self, lo: int, hi: int) -> np.ndarray:
        parts = [r[s:e] for r, s, e in self._slices(lo, hi) if e > s]
        return np.concatenate(parts) if parts else np.array([], np.int64)

    def _slices(self, lo: int, hi: int) -> list[tuple[np.ndarray, int, int]]:
        return [(r, int(np.searchsorted(r, lo, side="left")), int(np.searchsorted(r, hi, side="right")))
                for r in self.runs]


def _ascending(a: np.ndarray) -> bool:
    return len(a) < 2 or bool((a[1:] >= a[:-1]).all())


def _scan_addresses(ds: lance.LanceDataset, key: str, keys: pa.Array | _KeyRuns,
                    fragment_ids: Sequence[int]) -> pa.Table:
    """(key, _rowaddr) of `keys` found by scanning the key column of `fragment_ids`, matched a chunk of
    rows at a time. Integer keys (`_KeyRuns`) are matched against the keys within the chunk's [min, max]
    only, and a chunk ends once it holds twice as many rows as keys in its range (at least
    SCAN_MIN_CHUNK_ROWS): on a base written in key order the sets stay small enough for the CPU's cache and
    chunks without a key are skipped; on a base in random order a chunk has SCAN_CHUNK_ROWS rows. Other
    keys are matched against one hash set of them all."""
    kind = ds.schema.field(key).type
    scanner = ds.scanner(columns=[key], with_row_address=True, fragments=[ds.get_fragment(f) for f in fragment_ids],
                         batch_size=SCAN_BATCH_ROWS)
    runs = keys if isinstance(keys, _KeyRuns) else None
    parts: list[pa.Table] = []
    pending: list[pa.RecordBatch] = []
    rows, bounds = 0, [None, None]

    def in_range() -> int:
        return 0 if bounds[0] is None else runs.count(bounds[0], bounds[1])

    def flush() -> None:
        nonlocal rows
        chunk = pa.Table.from_batches(pending)
        column = chunk.column(key).combine_chunks()
        values: pa.Array | None = keys if runs is None else None
        if runs is not None and bounds[0] is not None:
            found = runs.within(bounds[0], bounds[1])
            values = pa.array(found, kind) if len(found) else None
        if values is not None:
            parts.append(chunk.filter(_member(column, values)))
        pending.clear()
        rows, bounds[0], bounds[1] = 0, None, None

    for batch in scanner.to_batches():
        pending.append(batch)
        rows += batch.num_rows
        if runs is not None:
            mm = pc.min_max(batch.column(key)).as_py()
            if mm["min"] is not None:
                bounds[0] = mm["min"] if bounds[0] is None else min(bounds[0], mm["min"])
                bounds[1] = mm["max"] if bounds[1] is None else max(bounds[1], mm["max"])
        if rows >= SCAN_CHUNK_ROWS or (runs is not None and rows >= SCAN_MIN_CHUNK_ROWS and rows >= 2 * in_range()):
            flush()
    if pending:
        flush()
    if not parts:  # no key of the backlog in these fragments
        return pa.table({key: pa.array([], kind), ADDRESS: pa.array([], pa.uint64())})
    return pa.concat_tables(parts).select([key, ADDRESS])


@dataclass(frozen=True)
class ApplyTask:
    table: MemWalTable
    version: int
    deletions: list[tuple[int, np.ndarray]]  # (fragment id, offsets)
    rows: pa.Table | None  # replacement rows to write as new fragments
    max_rows_per_file: int
    staged: tuple[str, ...] = ()  # or: staged upsert files to read, keeping the rows whose key is replaced
    replaced: pa.Array | None = None
    key: str = ""
    content: int = 0  # `content_id` of the version, from the driver


@dataclass
class ApplyResult:
    updated: list[FragmentMetadata] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    new: list[FragmentMetadata] = field(default_factory=list)


def _offsets_by_fragment(addresses: np.ndarray) -> dict[int, np.ndarray]:
    """Row addresses (fragment id << 32 | offset) as sorted offsets per fragment id."""
    out: dict[int, np.ndarray] = {}
    if len(addresses):
        if not (addresses[1:] > addresses[:-1]).all():  # a scan in fragment order returns them sorted
            addresses = np.sort(addresses, kind="stable")
        fragments, offsets = addresses >> np.uint64(32), addresses & np.uint64(0xFFFFFFFF)
        cuts = np.flatnonzero(np.diff(fragments)) + 1
        for f, o in zip(np.split(fragments, cuts), np.split(offsets, cuts), strict=True):
            out[int(f[0])] = o
    return out


def _has_duplicates(found: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a backlog key was found at more than one base row (the primary key is not unique). Integer
    keys are sorted with numpy (Arrow's count_distinct took 4.1 s on 4.4M keys, the sort 0.3 s)."""
    if not len(found):
        return False
    if pa.types.is_integer(found.type) and not found.null_count:
        ordered = np.sort(found.to_numpy())
        return bool((ordered[1:] == ordered[:-1]).any())
    return pc.count_distinct(found).as_py() != len(found)


def _refuse_duplicates(uri: str, key: str) -> ValueError:
    return ValueError(f"table {uri}: a key of the merge backlog has several rows in the base table (primary key "
                      f"{key!r}); refusing to apply")


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_MIX_CHUNK = 1 << 16


def _fingerprint(keys: pa.Array) -> int | None:
    """The sum (mod 2**64) of a 64-bit mix of every key (splitmix64's, a bijection), for integer keys; None
    for others. Equal counts and sums say two multisets of keys are equal: one key counted twice in place
    of another never gives the same sum, several do by a 2**-64 chance."""
    if not pa.types.is_integer(keys.type) or keys.null_count:
        return None
    a = keys.to_numpy(zero_copy_only=False)
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, len(a), _MIX_CHUNK):  # temporaries that stay in the CPU's cache
            z = a[start:start + _MIX_CHUNK].astype(np.uint64) + _MIX[0]
            z ^= z >> np.uint64(30)
            z *= _MIX[1]
            z ^= z >> np.uint64(27)
            z *= _MIX[2]
            z ^= z >> np.uint64(31)
            total += np.add.reduce(z, dtype=np.uint64)
    return int(total)


def _member(keys: pa.Array, values: pa.Array) -> pa.Array:
    """`pc.is_in(keys, value_set=values)`. Integer keys without nulls whose values span a range at most a few
    times their count go through numpy's lookup table (`np.isin(kind="table")`): about 10x faster than Arrow's
    hash set at millions of keys (measured: 8M keys against 4M values, 0.14 s against 1.44 s)."""
    if (keys.type == values.type and pa.types.is_integer(keys.type) and len(values) and len(keys)
            and not keys.null_count and not values.null_count):
        v = values.to_numpy()
        if int(v.max()) - int(v.min()) <= max(1 << 24, 4 * (len(keys) + len(values))):
            return pa.array(np.isin(keys.to_numpy(), v, kind="table"))
    return pc.is_in(keys, value_set=values)


def _delete_offsets(fragment: lance.LanceFragment, offsets: np.ndarray) -> FragmentMetadata | None:
    """`LanceFragment.delete_rows(offsets)`. pylance 14's wrapper first makes a list of Python ints; its
    binding takes any sequence, and an `array.array` hands it one int at a time (measured: 3x faster on 6.4M
    offsets, no page faults against 44,000)."""
    binding = getattr(fragment, "_fragment", None)
    if binding is None or not hasattr(binding, "delete_rows"):
        return fragment.delete_rows(np.asarray(offsets).tolist())
    raw = binding.delete_rows(array.array("Q", np.asarray(offsets, np.uint64).tobytes()))
    return None if raw is None else raw.metadata()


def _delete_rows(ds: lance.LanceDataset, deletions: Sequence[tuple[int, np.ndarray]], out: ApplyResult) -> None:
    """Write the deletion vectors (no rescan of the data): updated fragments, or removed when emptied."""
    for fragment_id, offsets in deletions:
        meta = _delete_offsets(ds.get_fragment(fragment_id), offsets)
        if meta is None:
            out.removed.append(fragment_id)
        else:
            out.updated.append(meta)


def apply_fragments(task: ApplyTask) -> ApplyResult:
    """Write the deletion vectors of the task's fragments and its replacement rows; commit nothing."""
    ds = _dataset(task.table, task.version, task.content)
    out = ApplyResult()
    _delete_rows(ds, task.deletions, out)
    rows: pa.Table | pa.RecordBatchReader | None = task.rows
    if task.staged:
        rows = _staged_reader(task.table.store, task.staged, ds.schema, task.key, task.replaced, True)
    if rows is not None and (not isinstance(rows, pa.Table) or rows.num_rows):
        out.new = write_fragments(rows, ds, schema=ds.schema, max_rows_per_file=task.max_rows_per_file,
                                  storage_options=lance_storage_options(task.table.storage_options))
    return out


def read_staged(store: ObjectStore, path: str) -> pa.Table:
    """One staged upsert file (Arrow IPC, the base schema) of the table's store; a local file is
    memory-mapped (every scan task reads every staged upsert's key, few of its other columns)."""
    local = store.local_path(path)
    if local is not None:
        return pa.ipc.open_file(pa.memory_map(local)).read_all()
    return pa.ipc.open_file(pa.py_buffer(store.get_buffer(path))).read_all()


def _staged_reader(store: ObjectStore, paths: Sequence[str], schema: pa.Schema, key: str, found: pa.Array | None,
                   keep_found: bool) -> pa.RecordBatchReader:
    """The staged upserts whose key is in `found` (keep_found) or not, one file in memory at a time."""

    def batches():
        for path in paths:
            t = read_staged(store, path)
            empty = pa.array([], t.schema.field(key).type)
            hit = pc.is_in(t.column(key), value_set=found if found is not None else empty)
            t = t.filter(hit if keep_found else pc.invert(hit))
            if t.num_rows:
                yield from t.cast(schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


# --- a large backlog: scan, delete and rewrite in the fragments' own task; the driver holds no keys ------


@dataclass(frozen=True)
class ScanApplyTask:
    """Scan the key column of `fragment_ids` at `version` for the backlog's keys and apply what is found
    there: deletion vectors and the replacement rows (upserts staged as files, or inline)."""

    table: MemWalTable
    version: int
    key: str
    fragment_ids: tuple[int, ...]
    staged: tuple[str, ...]
    upserts: pa.Table | None  # when not staged
    deleted_paths: tuple[str, ...]  # the commit's deleted keys: staged by the dedup, or a scratch file the driver wrote
    max_rows_per_file: int
    found_path: str  # where the upsert keys found here are written (scratch, in the table's store)
    share: tuple[int, int] = (0, 1)  # (i, n): this task fingerprints the i-th of n equal parts of the upsert keys
    content: int = 0  # `content_id` of the version, from the driver


@dataclass
class ScanApplyResult(ApplyResult):
    fragments: int = 0  # fragments with a row of the backlog
    found_upserts: int = 0
    found_deleted: int = 0
    found_path: str | None = None
    found_fingerprint: int | None = None  # `_fingerprint` of the upsert keys found here
    upserts_fingerprint: int | None = None  # of the task's share of the commit's upsert keys
    seconds: dict[str, float] = field(default_factory=dict)  # the task's time per step


def _array(column: pa.ChunkedArray) -> pa.Array:
    """One array of a column: its only chunk as it is (a staged file's, zero-copy from the memory map: the
    dedup writes each file as one record batch), else the chunks combined (a copy)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _sources(store: ObjectStore, staged: Sequence[str], upserts: pa.Table | None) -> list[pa.Table]:
    """The upserts of a task: each staged file read (zero-copy where local), or the inline table."""
    if staged:
        return [read_staged(store, p) for p in staged]
    assert upserts is not None, "a task has staged files or inline upserts"
    return [upserts]


def _write_ipc(store: ObjectStore, path: str, table: pa.Table) -> None:
    """An Arrow IPC file of the store, whole or not at all: on a local filesystem written straight to a
    temporary file renamed into place (no copy of it in memory), elsewhere put from a buffer."""
    local = store.local_path(path)
    if local is None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        store.put(path, sink.getvalue().to_pybytes())
        return
    os.makedirs(os.path.dirname(local), exist_ok=True)
    partial = f"{local}.tmp-{uuid.uuid4().hex}"
    with pa.OSFile(partial, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    os.replace(partial, local)


def stage_upserts(store: ObjectStore, upserts: pa.Table, prefix: str) -> str:
    """Upserts written as the staged file `<prefix>/upserts.arrow` (Arrow IPC, one record batch, as the
    Spark dedup stages them); its path. The caller deletes the prefix (GC deletes an abandoned one)."""
    path = f"{prefix}/upserts.arrow"
    _write_ipc(store, path, upserts.combine_chunks())
    return path


def _share_fingerprint(keys: Sequence[pa.Array], share: tuple[int, int]) -> int | None:
    """`_fingerprint` of the `share[0]`-th of `share[1]` equal parts of the keys in file order: the tasks'
    shares sum to the fingerprint of every key, each task mixing a part only."""
    total = sum(len(k) for k in keys)
    lo, hi = total * share[0] // share[1], total * (share[0] + 1) // share[1]
    out, start = 0, 0
    for k in keys:
        a, b = max(lo - start, 0), min(hi - start, len(k))
        if b > a:
            part = _fingerprint(k.slice(a, b - a))
            if part is None:
                return None
            out = (out + part) % 2**64
        start += len(k)
    return out


REPLACEMENT_BATCH_ROWS = 65_536  # replacement rows filtered and handed to the writer at once


def _replacements(parts: Sequence[pa.Table], keys: Sequence[pa.Array], ascending: Sequence[bool],
                  upserted: pa.Array, schema: pa.Schema) -> pa.RecordBatchReader | None:
    """The upsert rows whose key is in `upserted`, streamed a batch at a time (the writer never
    holds a copy of them all). Of a file in key order only its rows within upserted's [min, max] are matched
    (two binary searches); every file's keys go against one lookup of upserted."""
    if not len(upserted):
        return None
    bounds = pc.min_max(upserted).as_py() if pa.types.is_integer(upserted.type) else None
    within: list[tuple[pa.Table, pa.Array]] = []
    for part, k, ordered in zip(parts, keys, ascending, strict=True):
        if ordered and bounds is not None:
            a = k.to_numpy()
            s, e = int(np.searchsorted(a, bounds["min"], "left")), int(np.searchsorted(a, bounds["max"], "right"))
            part, k = part.slice(s, e - s), k.slice(s, e - s)
        if len(k):
            within.append((part, k))
    if not within:
        return None
    hit = _member(pa.concat_arrays([k for _, k in within]), upserted)
    if not pc.any(hit).as_py():
        return None

    def batches():
        start = 0
        for part, _ in within:
            for batch in part.to_batches(max_chunksize=REPLACEMENT_BATCH_ROWS):
                kept = batch.filter(hit.slice(start, batch.num_rows))
                start += batch.num_rows
                if kept.num_rows:
                    yield kept.cast(schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def _runs_of_rows(ds: lance.LanceDataset, fragment_ids: Sequence[int], rows: int) -> list[list[int]]:
    """`fragment_ids` in order, cut into runs of about `rows` base rows (a fragment is never split)."""
    runs: list[list[int]] = []
    total = 0
    for f in fragment_ids:
        n = ds.get_fragment(f).metadata.physical_rows or 0
        if not runs or total + n > rows:
            runs.append([])
            total = 0
        runs[-1].append(f)
        total += n
    return runs


def scan_apply(task: ScanApplyTask) -> ScanApplyResult:
    """The task: find the backlog's keys in its fragments, write their deletion vectors and the replacement
    rows as new fragments, and the upsert keys found to `found_path`; only metadata, counts and the task's
    seconds per step return. The fragments go by runs of about SCAN_CHUNK_ROWS rows (scan, delete, then
    their replacement rows streamed to the writer): a task's memory follows a run, not its share of the
    backlog. Integer keys in staged files in key order (a sorted append stream, or the benchmark's) are
    handled within each run's key range only: no step touches every upsert key."""
    clock = time.monotonic()
    seconds: dict[str, float] = {}

    def lap(step: str) -> None:
        nonlocal clock
        now = time.monotonic()
        seconds[step] = seconds.get(step, 0.0) + now - clock
        clock = now

    ds = _dataset(task.table, task.version, task.content)
    store = task.table.store
    kind = ds.schema.field(task.key).type
    parts = _sources(store, task.staged, task.upserts)
    keys = [_array(p.column(task.key)).cast(kind) for p in parts]  # the key column of each file only
    deleted = pa.concat_arrays([pa.array([], kind)] + [
        _array(read_staged(store, p).column(task.key)).cast(kind)
        for p in task.deleted_paths])
    integer = pa.types.is_integer(kind) and not deleted.null_count and not any(k.null_count for k in keys)
    ascending = [integer and _ascending(k.to_numpy()) for k in keys]
    if integer:
        deleted_runs = _KeyRuns([np.sort(deleted.to_numpy())])
        matcher: pa.Array | _KeyRuns = _KeyRuns(
            [k.to_numpy() if ordered else np.sort(k.to_numpy()) for k, ordered in zip(keys, ascending, strict=True)]
            + deleted_runs.runs)
    else:
        matcher = pa.concat_arrays([*keys, deleted])
    out = ScanApplyResult(seconds=seconds)
    upserted: list[pa.Array] = []  # the upsert keys found, run by run
    lap("task_read")

    def apply_run(fragment_ids: list[int]) -> pa.Array:
        found = _scan_addresses(ds, task.key, matcher, fragment_ids)
        lap("task_scan")
        # A key at two base rows: a deleted key's rows all go; an upserted key's rows are counted here and
        # the driver refuses the commit (its fingerprints, then the fresh-upsert round, see the key twice).
        offsets = _offsets_by_fragment(found.column(ADDRESS).to_numpy())
        out.fragments += len(offsets)
        _delete_rows(ds, sorted(offsets.items()), out)
        found_keys = found.column(task.key).combine_chunks()
        gone = deleted
        if integer and len(found_keys):  # the deleted keys within the run's range only
            bounds = pc.min_max(found_keys).as_py()
            gone = pa.array(deleted_runs.within(bounds["min"], bounds["max"]), kind)
        mine = found_keys.filter(pc.invert(_member(found_keys, gone)))
        out.found_deleted += len(found_keys) - len(mine)
        upserted.append(mine)
        lap("task_delete")
        return mine

    def replacement_batches(runs: list[list[int]]):
        for fragment_ids in runs:
            rows = _replacements(parts, keys, ascending, apply_run(fragment_ids), ds.schema)
            lap("task_filter")
            for batch in rows or ():
                lap("task_filter")
                yield batch
                lap("task_write")  # the writer's time, until it asks for the next batch

    runs = _runs_of_rows(ds, task.fragment_ids, SCAN_CHUNK_ROWS)
    if all(ascending):  # each run's replacement rows are a slice of each file: streamed run by run
        batches = replacement_batches(runs)
    else:  # matched once, against every upsert key found
        for fragment_ids in runs:
            apply_run(fragment_ids)
        found_all = pa.chunked_array(upserted, kind).combine_chunks()
        rows = _replacements(parts, keys, ascending, found_all, ds.schema)
        lap("task_filter")
        batches = iter(rows or ())
    out.new = write_fragments(pa.RecordBatchReader.from_batches(ds.schema, batches), ds, schema=ds.schema,
                              max_rows_per_file=task.max_rows_per_file,
                              storage_options=lance_storage_options(task.table.storage_options))
    lap("task_write")
    found = pa.chunked_array(upserted, kind)
    out.found_upserts = len(found)  # base rows of upserted keys (a key counted twice if at two rows)
    if len(found):
        _write_ipc(store, task.found_path, pa.table({task.key: found}))
        out.found_path = task.found_path
    prints = [_fingerprint(c) for c in found.chunks]
    out.found_fingerprint = None if None in prints else sum(prints) % 2**64
    out.upserts_fingerprint = _share_fingerprint(keys, task.share)
    lap("task_found")
    return out


@dataclass(frozen=True)
class FreshTask:
    """The upserts of `staged` (or inline) that no scan task found: written to `fresh_path`; a key found at
    more than one base row (by any task) is refused here."""

    table: MemWalTable
    key: str
    staged: tuple[str, ...]
    upserts: pa.Table | None
    found_paths: tuple[str, ...]
    fresh_path: str


def fresh_upserts(task: FreshTask) -> int | None:
    """The task: its fresh upserts written to `fresh_path` (base schema); returns their count, or None when
    one of its keys was found at two base rows (by two tasks)."""
    store = task.table.store
    upserts = pa.concat_tables(_sources(store, task.staged, task.upserts))
    ukeys = upserts.column(task.key).combine_chunks()
    found = [read_staged(store, p).column(task.key).cast(ukeys.type)
             for p in task.found_paths]
    found_all = pa.chunked_array([c for f in found for c in f.chunks], ukeys.type).combine_chunks()
    mine = found_all.filter(_member(found_all, ukeys))
    if _has_duplicates(mine):
        return None
    fresh = upserts.filter(pc.invert(_member(ukeys, mine)))
    if fresh.num_rows:
        _write_ipc(store, task.fresh_path, fresh)
    return fresh.num_rows


def _run(runner: TaskRunner, fn: Any, tasks: list, what: str) -> list:
    try:
        return runner(fn, tasks)
    except Exception as exc:  # an executor lost, a task raised: nothing committed, the merge retries
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ApplyTaskError(f"merge apply: a {what} task failed ({type(exc).__name__}: {line})") from exc


# --- plan ------------------------------------------------------------------------------------------


@dataclass
class ApplyPlan:
    """What one apply writes at version `version`: per fragment the offsets to delete, the replacement rows
    (each with its base fragment) and the fresh upserts (keys found nowhere: the marker commit's)."""

    version: int
    offsets: dict[int, np.ndarray]
    replacements: pa.Table
    replacement_fragments: np.ndarray
    fresh: pa.Table
    deleted_found: int


def plan_apply(table: MemWalTable, upserts: pa.Table, deleted_keys: pa.Table, runner: TaskRunner = in_process,
               parallelism: int = 1) -> ApplyPlan:
    """Locate every key of the backlog at the table handle's version (lookups through the runner).
    `upserts` may be their key column alone (staged upserts): then no replacement rows are assigned."""
    (key,) = table.primary_key
    ds = table.dataset
    kind = ds.schema.field(key).type
    keys = pa.concat_arrays([upserts.column(key).combine_chunks().cast(kind),
                             deleted_keys.column(key).combine_chunks().cast(kind)])
    keys = keys.take(pc.array_sort_indices(keys))  # each task's slice then touches few index pages
    per_task = max(1, min(LOOKUP_TASK_KEYS, -(-len(keys) // max(1, parallelism))))
    content = content_id(ds)
    # each slice copied out: a pickled Arrow slice carries its whole parent buffer, every task's keys
    tasks = [LookupTask(table, ds.version, key, pa.concat_arrays([keys.slice(i, per_task)]),
                        content)
             for i in range(0, len(keys), per_task)]
    found = pa.concat_tables(_run(runner, lookup_addresses, tasks, "lookup")) if tasks else pa.table(
        {key: keys, ADDRESS: pa.array([], pa.uint64())})
    addresses = found.column(ADDRESS).to_numpy()
    fragments = addresses >> np.uint64(32)
    by_fragment = _offsets_by_fragment(addresses)
    if _has_duplicates(found.column(key)):
        raise _refuse_duplicates(table.uri, key)
    present = pc.is_in(upserts.column(key), value_set=found.column(key).combine_chunks())
    replacements = upserts.filter(present)
    fresh = upserts.filter(pc.invert(present))
    if replacements.num_rows and replacements.num_columns > 1:
        where = pa.table({key: found.column(key), "__fragment": pa.array(fragments)})
        joined = replacements.select([key]).append_column("__i", pa.array(np.arange(replacements.num_rows)))
        joined = joined.join(where, key).sort_by("__i")
        replacement_fragments = joined.column("__fragment").to_numpy()
    else:
        replacement_fragments = np.array([], np.uint64)
    deleted_found = int(pc.sum(pc.is_in(found.column(key), value_set=deleted_keys.column(key).combine_chunks()
                                        .cast(found.schema.field(key).type))).as_py() or 0)
    return ApplyPlan(ds.version, by_fragment, replacements, replacement_fragments, fresh, deleted_found)


def _contiguous(rows: Mapping[int, int], parallelism: int) -> list[list[int]]:
    """Fragment ids in order, cut into at most `parallelism` runs of about equal rows: a base written in
    key order gives each task a key range of its own (the scan then matches each chunk against the keys
    within its range only)."""
    ids = sorted(rows)
    total = sum(rows.values())
    runs: list[list[int]] = [[]]
    done = 0
    for f in ids:
        if runs[-1] and done >= total * len(runs) / max(1, parallelism) and len(runs) < parallelism:
            runs.append([])
        runs[-1].append(f)
        done += rows[f]
    return [r for r in runs if r]


def _balanced(weights: Mapping[int, int], parallelism: int) -> list[list[int]]:
    """Fragment ids dealt to at most `parallelism` tasks, heaviest first, each to the lightest task."""
    n = max(1, min(parallelism, len(weights)))
    tasks: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for f in sorted(weights, key=lambda f: -weights[f]):
        i = load.index(min(load))
        tasks[i].append(f)
        load[i] += weights[f]
    return [t for t in tasks if t]


def apply_tasks(table: MemWalTable, plan: ApplyPlan, parallelism: int, max_rows_per_file: int,
                staged: Sequence[str] = ()) -> list[ApplyTask]:
    """The apply's tasks: the touched fragments dealt by rows to delete; the replacement rows go with
    their fragments' task, or, when the upserts are staged, the files are dealt round-robin and each task
    keeps the rows of the replaced keys."""
    groups = _balanced({f: len(o) for f, o in plan.offsets.items()}, parallelism)
    (key,) = table.primary_key
    replaced = plan.replacements.column(key).combine_chunks() if staged else None
    content = content_id(table.dataset)
    n = max(len(groups), min(parallelism, len(staged)) if staged and plan.replacements.num_rows else 0, 1)
    groups += [[] for _ in range(n - len(groups))]
    tasks = []
    for i, fragment_ids in enumerate(groups):
        rows = None
        if not staged and plan.replacements.num_rows:
            mask = pc.is_in(pa.array(plan.replacement_fragments), value_set=pa.array(fragment_ids, pa.uint64()))
            rows = plan.replacements.filter(mask)
        files = tuple(staged[i::n]) if replaced is not None and len(replaced) else ()
        tasks.append(ApplyTask(table, plan.version,
                               [(f, plan.offsets[f]) for f in sorted(fragment_ids)], rows,
                               max_rows_per_file, files, replaced, key, content))
    return [t for t in tasks if t.deletions or t.rows is not None or t.staged]


def staged_keys(table: MemWalTable, staged: Sequence[str]) -> pa.Table:
    """The key column of the staged upserts (one file in memory at a time): all the driver keeps of them."""
    (key,) = table.primary_key
    kind = table.schema.field(key).type
    # copied out of each file (a zero-copy column would keep the whole file's buffer alive)
    parts = [pa.concat_arrays(read_staged(table.store, path).column(key).chunks)
             .cast(kind)
             for path in staged]
    return pa.table({key: pa.concat_arrays(parts) if parts else pa.array([], kind)})


# --- commit ----------------------------------------------------------------------------------------


def _commit_update(table: MemWalTable, version: int, results: Sequence[ApplyResult]) -> lance.LanceDataset:
    op = lance.LanceOperation.Update(
        removed_fragment_ids=sorted(f for r in results for f in r.removed),
        updated_fragments=[m for r in results for m in r.updated],
        new_fragments=[m for r in results for m in r.new],
    )
    return lance.LanceDataset.commit(table.dataset, op, read_version=version)


@dataclass
class _Attempt:
    """What one attempt applied at `version` (not committed yet) and how the marker commit finds the fresh
    upserts."""

    version: int
    results: list[ApplyResult]
    fragments: int
    replaced: int
    deleted: int
    fresh_rows: int
    fresh: Callable[[lance.LanceDataset], pa.Table | pa.RecordBatchReader]
    task_seconds: dict[str, float] = field(default_factory=dict)  # summed over the tasks, per step


def _apply_by_lookup(table: MemWalTable, data: MergeData, runner: TaskRunner, parallelism: int,
                     max_rows_per_file: int) -> _Attempt:
    """A backlog small against the table: the driver plans (the keys through the index, in tasks), the
    fragments' tasks apply. The driver holds the keys and their addresses (few: `use_index`)."""
    (key,) = table.primary_key
    staged = tuple(data.staged)
    upserts = staged_keys(table, staged) if staged else data.open_upserts()
    plan = plan_apply(table, upserts, data.open_deleted(table.store), runner, parallelism)
    tasks = apply_tasks(table, plan, parallelism, max_rows_per_file, staged) if plan.offsets else []
    results = _run(runner, apply_fragments, tasks, "apply")
    found = plan.replacements.column(key).combine_chunks()

    def fresh(ds: lance.LanceDataset) -> pa.Table | pa.RecordBatchReader:
        if not staged:
            return plan.fresh
        if not plan.fresh.num_rows:
            return ds.schema.empty_table()
        return _staged_reader(table.store, staged, ds.schema, key, found, False)

    return _Attempt(plan.version, results, len(plan.offsets), plan.replacements.num_rows, plan.deleted_found,
                    plan.fresh.num_rows, fresh)


def _apply_by_scan(table: MemWalTable, data: MergeData, runner: TaskRunner, parallelism: int,
                   max_rows_per_file: int, scratch: str) -> _Attempt:
    """A backlog large against the table: each task scans its fragments' key column for the backlog's keys
    and applies what it finds there (`scan_apply`); a second round writes the upserts no task found
    (`fresh_upserts`) for the marker commit. The driver holds file paths, counts and fragment metadata:
    never the upserts or their keys, nor the deleted keys the dedup staged; upserts and deleted keys it got in
    memory are written once to scratch files, so each task's input is paths, never the rows."""
    (key,) = table.primary_key
    ds = table.dataset
    staged = tuple(data.staged)
    inline = None if staged else data.open_upserts()
    if inline is not None and inline.num_rows:  # written once for every task, as the deleted keys below
        staged = (stage_upserts(table.store, inline, scratch),)
    deleted = tuple(data.staged_deleted)  # the tasks read the staged deleted keys where they are
    if data.deleted_keys.num_rows:  # the others, written once for every task (not carried by each task's pickle)
        deleted += (f"{scratch}/deleted.arrow",)
        _write_ipc(table.store, deleted[-1], data.deleted_keys.select([key]))
    sizes = {f.fragment_id: f.metadata.physical_rows for f in ds.get_fragments()}
    groups = _contiguous(sizes, parallelism)
    tasks = [ScanApplyTask(table, ds.version, key, tuple(sorted(group)), staged,
                           None if staged else inline,
                           deleted, max_rows_per_file, f"{scratch}/found-{i}.arrow", (i, len(groups)),
                           content_id(ds))
             for i, group in enumerate(groups)]
    results: list[ScanApplyResult] = _run(runner, scan_apply, tasks, "apply")
    found_paths = tuple(r.found_path for r in results if r.found_path)
    upserts = inline.num_rows if inline is not None else data.staged_rows
    found_upserts = sum(r.found_upserts for r in results)
    found_prints = [r.found_fingerprint for r in results]
    shares = [r.upserts_fingerprint for r in results]  # each task mixed its share of the upsert keys
    once = (bool(results) and found_upserts == upserts and None not in found_prints and None not in shares
            and sum(found_prints) % 2**64 == sum(shares) % 2**64)  # every upsert found, each once
    sources: list[tuple[tuple[str, ...], pa.Table | None]] = []
    if found_upserts and not once:  # which upserts are fresh, and no key found twice
        sources = [(tuple(staged[i::parallelism]), None) for i in range(min(parallelism, len(staged)))]
    fresh_tasks = [FreshTask(table, key, files, rows, found_paths,
                             f"{scratch}/fresh-{i}.arrow") for i, (files, rows) in enumerate(sources)]
    started = time.monotonic()
    counts = _run(runner, fresh_upserts, fresh_tasks, "apply")
    seconds = {k: sum(r.seconds.get(k, 0.0) for r in results) for k in results[0].seconds} if results else {}
    seconds["fresh_round"] = time.monotonic() - started
    if None in counts:
        raise _refuse_duplicates(table.uri, key)
    fresh_paths = tuple(t.fresh_path for t, n in zip(fresh_tasks, counts, strict=True) if n)

    def fresh(ds: lance.LanceDataset) -> pa.Table | pa.RecordBatchReader:
        if not found_upserts:  # every upsert is fresh
            return inline if inline is not None else _staged_reader(table.store, staged, ds.schema, key, None,
                                                                    False)
        if not fresh_paths:
            return ds.schema.empty_table()
        return _staged_reader(table.store, fresh_paths, ds.schema, key, None, False)

    return _Attempt(ds.version, list(results), sum(r.fragments for r in results), found_upserts,
                    sum(r.found_deleted for r in results), sum(counts) if found_upserts else upserts, fresh, seconds)


def apply_commit(table: MemWalTable, markers: Sequence[tuple[str, int]], since: Mapping[str, int],
                 data: MergeData, runner: TaskRunner = in_process, parallelism: int = 1,
                 max_rows_per_file: int = 1024 * 1024) -> CommitPasses:
    """One merge commit (a `memwal.merge.MergeInput`) through the fragment apply (module docstring), under
    the MemWAL index lock; the two passes where the table does not take it. Staged upserts (`data.staged`)
    are read by the tasks where they are. Returns what it did."""
    pk = list(table.primary_key)
    if not supports_apply(table.refresh().dataset, pk):
        return passes(table, markers, since, data)
    staged = tuple(data.staged)
    upserted = data.staged_rows if staged else data.open_upserts().num_rows
    keys = upserted + data.deleted_rows
    out = CommitPasses()
    first, *rest = marker_steps(markers, since)
    compacted = [CompactedSsTable(r, g) for r, g in first]
    scratch = f"{naming.STAGING_DIR}/apply-{uuid.uuid4().hex}"
    scanned = False  # the scan path writes scratch files (the lookup path none: nothing to list and delete)
    try:
        for attempt in range(1, APPLY_ATTEMPTS + 1):
            started = time.monotonic()
            table.refresh()
            check_progress(table, since)
            if use_index(table.dataset, keys):
                done = _apply_by_lookup(table, data, runner, parallelism, max_rows_per_file)
            else:
                scanned = True
                done = _apply_by_scan(table, data, runner, parallelism, max_rows_per_file, f"{scratch}/a{attempt}")
            out.timings_s["apply_tasks"] = out.timings_s.get("apply_tasks", 0.0) + time.monotonic() - started
            for step, seconds in done.task_seconds.items():  # summed over tasks: where the tasks' time went
                out.timings_s[step] = out.timings_s.get(step, 0.0) + seconds
            if not done.fragments:
                break
            fault_point("merge.apply_before_commit")
            t2 = time.monotonic()
            table.refresh()
            check_progress(table, since)  # a merger without our lock that got here first: replan, nothing ours
            table.check_lease()
            try:
                table.adopt(_commit_update(table, done.version, done.results))
            except OSError as exc:
                if not is_update_conflict(exc) or attempt == APPLY_ATTEMPTS:
                    raise
                log.info("merge apply: our Update (read version %d) conflicted with a concurrent commit (attempt "
                         "%d): %s; replanning", done.version, attempt, str(exc).splitlines()[0])
                continue
            finally:
                out.timings_s["apply_commit"] = out.timings_s.get("apply_commit", 0.0) + time.monotonic() - t2
            out.table_commits += 1
            out.deleted = done.deleted
            log.info("merge apply: Update committed at version %d (read %d): %d fragments updated, %d rows "
                     "replaced, %d deleted in %.2fs", table.version, done.version, done.fragments, done.replaced,
                     done.deleted, time.monotonic() - started)
            fault_point("merge.between_update_and_marker")
            break
        else:  # pragma: no cover - the loop either breaks or raises
            raise AssertionError("unreachable")

        def marker(ds: lance.LanceDataset) -> dict:
            rows = done.fresh(ds)  # a table (its keys decide the join) or a stream of the fresh rows' files
            join = use_index(ds, rows if isinstance(rows, pa.Table) else done.fresh_rows, pk)
            return (ds.merge_insert(pk).when_matched_update_all().when_not_matched_insert_all()
                    .mark_sstables_as_compacted(compacted).use_index(join).conflict_retries(0).execute(rows))

        t3 = time.monotonic()
        run_pass(table, since, marker, "marker")
        out.table_commits += 1 + advance_markers(table, rest)
        out.timings_s["marker_commit"] = time.monotonic() - t3
        out.upserted = upserted
        return out
    finally:
        if scanned:
            table.store.delete_prefix(scratch)


# --- which apply a merge uses ------------------------------------------------------------------------

Apply = Callable[[MemWalTable, Sequence[tuple[str, int]], Mapping[str, int], "MergeData"], CommitPasses]


def passes(table: MemWalTable, markers: Sequence[tuple[str, int]], since: Mapping[str, int],
           data: MergeData) -> CommitPasses:
    """The two passes (`merge_commit.commit_passes`) on a MergeInput's upserts and deleted keys (and, where
    the dedup told, each region's lowest winning generations: `MergeInput.winners`)."""
    return commit_passes(table, markers, since, data.open_upserts(), data.open_deleted(table.store),
                         getattr(data, "winners", None))


def choose_apply(mode: str, runner: TaskRunner | None = None, parallelism: int = 1) -> Apply:
    """The commit function of a merge. "passes": `merge_commit.commit_passes`; "fragments": the apply
    here, its tasks on `runner` (in process if None); "auto": the fragment apply when tasks run
    elsewhere (a runner is given: Spark), else the two passes, which were faster in process at every
    size measured (bench/merge_scale.py, bench/README.md)."""
    if mode == "passes" or (mode == "auto" and runner is None):
        return passes
    chosen = runner or in_process

    def apply(table: MemWalTable, markers: Sequence[tuple[str, int]], since: Mapping[str, int],
              data: MergeData) -> CommitPasses:
        return apply_commit(table, markers, since, data, chosen, parallelism)

    return apply
