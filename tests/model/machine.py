"""A model-based test of the whole MemWAL pipeline: a hypothesis RuleBasedStateMachine whose model is a
plain dict (primary key -> row) of every acknowledged write (deletes pop).

Rules: put / delete (a small key space, so updates collide; keys routed to 1-2 regions by key % n),
flush, close, crash (drop the RegionWriter without close: the WAL is durable), takeover (a new
RegionWriter on a live region: the old one becomes a fenced, stale writer), stale writer put / delete /
flush, partial and full merge, index catch-up, snapshot refresh, compaction (memwal.compaction, forced),
version retention (memwal.retention), GC (sometimes after Lance's cleanup_old_versions, so that GC
really deletes), and reads.

Checked:
- strong reads (our LsmReader with the live MemTables of the current writers) equal the model exactly;
  point lookups too;
- Lance core's LsmScanner over the flushed state equals our LsmReader without MemTables;
- merged_generations never decreases (every step), and a merge ends exactly where it should;
- merge, compaction and GC never change the LSM view; GC never deletes a WAL entry that is not yet flushed;
- compaction keeps merged_generations and index_catchup; after version retention (and a GC), an LSM read
  at every retained table version equals the same read before;
- a stale writer never commits a region manifest: the stored writer_epoch always stays the newest;
- at the end: a closing put into every region, then every region is recovered and flushed, fully merged
  (the final merge merges in every region, through `dedup`), and the base table equals the model (no
  acknowledged write lost, none applied twice); a final GC deletes a merged generation in every region
  and changes nothing visible. These end-of-sequence events are certain, so they are asserted; the
  counts of the drawn steps are only printed.

A put by a fenced writer may legitimately succeed (memwal-spec.txt, Appendix 1: epochs are checked at
manifest updates, not on every WAL write): its entry lands at the next free WAL position and is absorbed
by the current writer's next write or replayed by the next writer. Until then a strong read through the
current writer cannot see it; the machine models exactly that (`shadow`).

Schemas are drawn as users write them (`Shape`): NOT NULL non-key columns (LanceDB's `LanceModel`), a
composite key, more index types in the maintained set (BITMAP, NGRAM, ZONEMAP, BLOOMFILTER, INVERTED,
LABEL_LIST), and a column added to the base mid-sequence (`add_column`: with MemTables and unflushed WAL
about, and between flushes), whose values are checked against the model too.

Used by tests/model/test_lsm_model.py (local and S3) and scripts/soak.py; vector_machine.py runs it on a
table with vector and full-text indexes.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import lance
import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from memwal.catchup import catchup_table
from memwal.compaction import CompactionConfig, compact_table
from memwal.errors import FencedError, WriterClosedError
from memwal.gc import GcConfig, gc_table
from memwal.mem_wal_index import initialize_mem_wal, load_index
from memwal.merge import MergeConfig, local_dedup, merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import list_regions, load_latest_manifest
from memwal.retention import RetentionConfig, retain_versions
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.storage import ObjectStore, lance_storage_options
from memwal.table import MemWalTable
from memwal.wal import list_wal_positions
from memwal.writer import RegionWriter, WriterConfig

from support.maintenance import merge_region
from support.tables import PK, SCHEMA, Row, indexes_covering_every_fragment, lance_core_scan, view


def _caught_up(index_catchup) -> dict[str, dict[str, int]]:
    """index_catchup without its 0 entries (0 and no entry both read as not caught up)."""
    out = {k: {r: g for r, g in v.items() if g} for k, v in index_catchup.items()}
    return {k: v for k, v in out.items() if v}


KEYS = 8  # primary keys 0..7; the base table starts with 0..3
BASE_KEYS = range(4)
INDEX_NAME = "name_idx"
MAX_STALE = 3


# More base-table indexes a sequence may draw (all maintained): name -> (column, Lance type).
EXTRA_INDEXES = {"name_bitmap": ("name", "BITMAP"), "name_ngram": ("name", "NGRAM"),
                 "score_zonemap": ("score", "ZONEMAP"), "name_bloom": ("name", "BLOOMFILTER"),
                 "name_fts": ("name", "INVERTED"), "tags_labels": ("tags", "LABEL_LIST")}
KEY_PART = "p"  # the second key column's value in a composite-key sequence
ADDED_COLUMN = "extra"


@dataclass(frozen=True)
class Shape:
    """The table's schema as a user might have made it."""

    not_null: bool = False  # name and score NOT NULL, as a LanceModel makes every non-Optional field
    composite: bool = False  # the key is (id, part)
    indexes: tuple[str, ...] = ()  # EXTRA_INDEXES drawn

    def schema(self, added: bool = False) -> pa.Schema:
        key = {**PK, "lance-schema:unenforced-primary-key:position": "1"} if self.composite else PK
        fields = [pa.field("id", pa.int64(), nullable=False, metadata=key)]
        if self.composite:
            fields.append(pa.field("part", pa.string(), nullable=False,
                                   metadata={**PK, "lance-schema:unenforced-primary-key:position": "2"}))
        fields += [pa.field("name", pa.string(), nullable=not self.not_null),
                   pa.field("score", pa.float64(), nullable=not self.not_null)]
        if "tags_labels" in self.indexes:
            fields.append(pa.field("tags", pa.list_(pa.string())))
        if added:
            fields.append(pa.field(ADDED_COLUMN, pa.int64()))
        return pa.schema(fields)


SHAPES = st.builds(Shape, not_null=st.booleans(), composite=st.booleans(),
                   indexes=st.lists(st.sampled_from(sorted(EXTRA_INDEXES)), max_size=2, unique=True).map(tuple))


WRITE_OPS = st.lists(
    st.tuples(st.sampled_from(["put", "put", "delete", "flush"]),
              st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=4)),
    min_size=1, max_size=4,
)


@dataclass(frozen=True)
class Loc:
    uri: str
    storage_options: dict[str, str] | None

    def store(self) -> ObjectStore:
        return ObjectStore(self.uri, self.storage_options)


def _tracked(fn: Callable) -> Callable:
    """Marks the machine failed if a step raises, so teardown skips the final checks."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        self.stats[fn.__name__] += 1
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return wrapper


class LsmMachine(RuleBasedStateMachine):
    dedup = staticmethod(local_dedup)  # the merge's dedup hook: the Spark variant sets spark_dedup(spark)
    """Subclass and set `new_location` (a callable returning a fresh Loc per sequence)."""

    new_location: ClassVar[Callable[[], Loc]]
    # Check manifests and merge progress after every step (cheap locally; on S3 the rules that can change
    # progress check it themselves, and reads and the final check cover the manifests).
    check_every_step: ClassVar[bool] = True
    cleanup_location: ClassVar[Callable[[Loc], None]] = staticmethod(lambda loc: None)
    static_keys: ClassVar[range] = range(0)  # base rows outside the written key space (never changed)
    draw_schemas: ClassVar[bool] = True  # False: the suite's plain SCHEMA (a subclass with columns of its own)
    stats: ClassVar[Counter]

    def __init__(self) -> None:
        super().__init__()
        self.loc: Loc | None = None
        self._store: ObjectStore | None = None
        self.failed = False
        self.model: dict[int, Row] = {}
        self.regions: list[str] = []
        self.writers: list[RegionWriter | None] = []
        self.epochs: list[int] = []  # highest writer_epoch ever claimed per region
        self.stale: list[tuple[int, RegionWriter]] = []
        self.shadow: list[dict[int, Row | None]] = []  # per region: key -> value the current writer still sees
        self.merged: dict[str, int] = {}
        self.catchup: dict[str, int] = {}
        self.counter = 0
        self.config = WriterConfig()
        self.shape = Shape()
        self.added = False  # ADDED_COLUMN is on the base table
        self.added_model: dict[int, int | None] = {}  # key -> its ADDED_COLUMN value (None: null)

    # -- setup -------------------------------------------------------------------------------------

    @initialize(
        n_regions=st.integers(1, 2),
        auto_flush_rows=st.sampled_from([None, None, 3]),
        lance_core_init=st.booleans(),
        shape=SHAPES,
    )
    @_tracked
    def setup(self, n_regions: int, auto_flush_rows: int | None, lance_core_init: bool, shape: Shape) -> None:
        type(self).stats["sequences"] += 1
        if type(self).draw_schemas:
            self.shape = shape
            type(self).stats["not_null_sequences"] += shape.not_null
            type(self).stats["composite_key_sequences"] += shape.composite
            type(self).stats["extra_index_sequences"] += bool(shape.indexes)
        self.loc = type(self).new_location()
        opts = lance_storage_options(self.loc.storage_options)
        base_keys = list(BASE_KEYS) + list(self.static_keys)
        base_vals = [(k, (f"base.{k}", float(-1 - k))) for k in base_keys]
        ds = lance.write_dataset(self._table(base_vals), self.loc.uri, storage_options=opts)
        ds.create_scalar_index("name", "BTREE", name=INDEX_NAME)
        for name in self.shape.indexes:
            column, kind = EXTRA_INDEXES[name]
            ds.create_scalar_index(column, kind, name=name)
        self._create_indexes(ds)
        if lance_core_init:
            lance.dataset(self.loc.uri, storage_options=opts).initialize_mem_wal(unsharded=True)
        else:
            initialize_mem_wal(self.loc.uri, self.loc.storage_options, None)
        self.model = dict(base_vals)
        self.regions = [str(uuid.uuid4()) for _ in range(n_regions)]
        self.writers = [None] * n_regions
        self.epochs = [0] * n_regions
        self.shadow = [{} for _ in range(n_regions)]
        self.config = WriterConfig(
            max_memtable_rows=auto_flush_rows or 10**9, max_memtable_bytes=10**12, max_flush_interval_s=None
        )

    def teardown(self) -> None:
        try:
            if self.loc is not None and not self.failed:
                self._final_check()
        finally:
            if self.loc is not None:
                type(self).cleanup_location(self.loc)

    # -- helpers -----------------------------------------------------------------------------------

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = self.loc.store()
        return self._store

    @property
    def uri(self) -> str:
        return self.loc.uri

    @property
    def so(self) -> dict[str, str] | None:
        return self.loc.storage_options

    def _region_of(self, key: int) -> int:
        return key % len(self.regions)

    def _has_manifest(self, ri: int) -> bool:
        return self.epochs[ri] > 0

    def _open_writer(self, ri: int) -> RegionWriter:
        w = RegionWriter(self.uri, self.regions[ri], storage_options=self.so, config=self.config)
        assert w.writer_epoch == self.epochs[ri] + 1, (
            f"claim must bump writer_epoch by one: {self.epochs[ri]} -> {w.writer_epoch}"
        )
        self.epochs[ri] = w.writer_epoch
        self.shadow[ri] = {}  # the new writer replayed every WAL entry, stale ones included
        return w

    def _writer(self, ri: int) -> RegionWriter:
        if self.writers[ri] is None:
            self.writers[ri] = self._open_writer(ri)
        return self.writers[ri]

    def _rows(self, keys: list[int]) -> tuple[pa.Table, list[tuple[int, Row]]]:
        self.counter += 1
        vals = [(k, (f"w{self.counter}.{j}", float(self.counter * 10 + j))) for j, k in enumerate(keys)]
        return self._table(vals), vals

    def _table(self, vals: list[tuple[int, Row]]) -> pa.Table:
        """The rows written for (key, (name, score)) pairs in the drawn shape (a subclass adds columns derived
        from name); ADDED_COLUMN, once added, carries a value the model remembers per key."""
        if not type(self).draw_schemas:
            return pa.table({"id": [k for k, _ in vals], "name": [v[0] for _, v in vals],
                             "score": [v[1] for _, v in vals]}, schema=SCHEMA)
        schema = self.shape.schema(self.added)
        columns = {"id": [k for k, _ in vals], "part": [KEY_PART] * len(vals), "name": [v[0] for _, v in vals],
                   "score": [v[1] for _, v in vals], "tags": [[v[0], "all"] for _, v in vals],
                   ADDED_COLUMN: [int(v[1] * 10) for _, v in vals]}
        return pa.table({f.name: columns[f.name] for f in schema}, schema=schema)

    def _create_indexes(self, ds: lance.LanceDataset) -> None:
        """More base-table indexes, created before the MemWAL is initialised (none here)."""

    def _keys(self, keys: list[int]) -> pa.Table:
        if self.shape.composite:
            return pa.table({"id": pa.array(keys, pa.int64()), "part": [KEY_PART] * len(keys)})
        return pa.table({"id": pa.array(keys, pa.int64())})

    def _key(self, k: int):
        """A key as reader.get takes it."""
        return (k, KEY_PART) if self.shape.composite else k

    def _by_region(self, keys: list[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for k in keys:
            out.setdefault(self._region_of(k), []).append(k)
        return out

    def _memtables(self) -> list[tuple[str, int, pa.Table]]:
        return [
            (self.regions[i], w.memtable.generation, w.memtable_table())
            for i, w in enumerate(self.writers)
            if w is not None
        ]

    def _lsm(self, with_memtables: bool) -> dict[int, Row]:
        reader = LsmReader(MemWalTable(self.uri, self.so), memtables=self._memtables() if with_memtables else ())
        return view(reader.scan())

    def _expected_strong(self) -> dict[int, Row]:
        """The model as the current writers see it: stale writes not yet absorbed are not visible."""
        expected = dict(self.model)
        for shadow in self.shadow:
            for k, prev in shadow.items():
                if prev is None:
                    expected.pop(k, None)
                else:
                    expected[k] = prev
        return expected

    def _recover_all(self) -> None:
        """A strongly consistent read needs every region's MemTable: restart crashed writers (WAL replay)."""
        for ri in range(len(self.regions)):
            if self.writers[ri] is None and self._has_manifest(ri):
                self.writers[ri] = self._open_writer(ri)

    def _check_merged_monotonic(self) -> dict[str, int]:
        details = load_index(self.uri, self.so).details
        for region, gen in self.merged.items():
            assert details.merged_generation(region) >= gen, (
                f"merged_generations[{region}] went back from {gen} to {details.merged_generation(region)}"
            )
        for region, gen in details.merged_generations.items():
            self.merged[region] = max(self.merged.get(region, 0), gen)
        caught = details.index_catchup.get(INDEX_NAME, {})
        for region, gen in caught.items():
            assert gen >= self.catchup.get(region, 0), f"index_catchup[{region}] went back"
            assert gen <= details.merged_generation(region), f"index_catchup[{region}] {gen} > merged"
            self.catchup[region] = gen
        return dict(details.merged_generations)

    def _highest_flushed(self, ri: int) -> int:
        return load_latest_manifest(self.store, self.regions[ri]).current_generation - 1

    def _apply(self, vals: list[tuple[int, Row | None]]) -> None:
        for k, v in vals:
            if v is None:
                self.model.pop(k, None)
                self.added_model.pop(k, None)
            else:
                self.model[k] = v
                self.added_model[k] = int(v[1] * 10) if self.added else None

    # -- writes ------------------------------------------------------------------------------------

    def _write(self, ops: list[tuple[str, list[int]]]) -> None:
        for op, keys in ops:
            if op == "flush":
                ri = keys[0] % len(self.regions)
                if self.writers[ri] is not None:
                    self.writers[ri].flush()
                continue
            for ri, ks in self._by_region(keys).items():
                if op == "put":
                    table, vals = self._rows(ks)
                    self._writer(ri).put(table)
                else:
                    vals = [(k, None) for k in ks]
                    self._writer(ri).delete(self._keys(ks))
                self.shadow[ri] = {}  # the write collided with (and absorbed) any stale entry before it
                self._apply(vals)

    @rule(ops=WRITE_OPS)
    @_tracked
    def write(self, ops: list[tuple[str, list[int]]]) -> None:
        """put / delete (keys collide; duplicates within one put: the later row wins) / flush."""
        self._write(ops)

    @rule(ops=WRITE_OPS)
    @_tracked
    def write_more(self, ops: list[tuple[str, list[int]]]) -> None:
        """The same as write: a second rule so that writes are a larger share of the steps."""
        self._write(ops)

    def _any_writer(self) -> bool:
        return any(w is not None for w in self.writers)

    def _any_region(self) -> bool:
        return any(e > 0 for e in self.epochs)

    @precondition(lambda self: self._any_writer())
    @rule(r=st.integers(0, 1))
    @_tracked
    def close(self, r: int) -> None:
        ri = r % len(self.regions)
        if self.writers[ri] is not None:
            self.writers[ri].close()
            self.writers[ri] = None

    @precondition(lambda self: self._any_writer())
    @rule(r=st.integers(0, 1))
    @_tracked
    def crash(self, r: int) -> None:
        """The writer process dies: its MemTable is gone, its WAL entries are durable."""
        self.writers[r % len(self.regions)] = None

    @rule(r=st.integers(0, 1))
    @_tracked
    def takeover(self, r: int) -> None:
        """A new writer claims the region while the old one still runs: the old one is fenced."""
        ri = r % len(self.regions)
        old = self.writers[ri]
        self.writers[ri] = self._open_writer(ri)
        if old is not None:
            self.stale.append((ri, old))
            del self.stale[:-MAX_STALE]

    @precondition(lambda self: self.stale)
    @rule(i=st.integers(0, MAX_STALE - 1), op=st.sampled_from(["put", "delete", "flush"]),
          keys=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=2))
    @_tracked
    def stale_writer(self, i: int, op: str, keys: list[int]) -> None:
        ri, w = self.stale[i % len(self.stale)]
        store = self.store
        region = self.regions[ri]
        manifest_before = load_latest_manifest(store, region)
        wal_before = list_wal_positions(store, region)
        keys = [k for k in keys if self._region_of(k) == ri] or [ri]
        if op == "flush":
            try:
                result = w.flush()
            except (FencedError, WriterClosedError):
                result = "refused"
            if w.memtable.rows and not isinstance(result, str):
                raise AssertionError(f"a fenced writer with {w.memtable.rows} rows flushed: {result}")
        else:
            if op == "put":
                table, vals = self._rows(keys)
            else:
                table, vals = self._keys(keys), [(k, None) for k in keys]
            entries = w.stats.wal_entries
            try:
                (w.put if op == "put" else w.delete)(table)
            except (FencedError, WriterClosedError):
                pass
            if w.stats.wal_entries > entries:
                # Durable in the WAL (acknowledged, or written before an automatic flush was refused):
                # it will be replayed. The current writer does not see it until it absorbs it.
                type(self).stats["stale_write_accepted"] += 1
                for k, _ in vals:
                    self.shadow[ri].setdefault(k, self.model.get(k))
                self._apply(vals)
                return
        type(self).stats["stale_refused"] += 1
        manifest_after = load_latest_manifest(store, region)
        assert manifest_after.version == manifest_before.version, "a fenced writer committed a manifest"
        assert manifest_after.writer_epoch == self.epochs[ri]
        left = set(list_wal_positions(store, region)) - set(wal_before)
        assert all(p <= manifest_after.replay_after_wal_entry_position for p in left), (
            f"a refused write left WAL entries {sorted(left)} that a writer would replay")

    # -- background jobs ---------------------------------------------------------------------------

    @precondition(lambda self: self._any_region())
    @rule(r=st.integers(0, 1), up_to=st.one_of(st.none(), st.integers(0, 6)), per_commit=st.integers(1, 3))
    @_tracked
    def merge(self, r: int, up_to: int | None, per_commit: int) -> None:
        """up_to None: merge_table over every region; else merge_region(up_to_generation=up_to)."""
        config = MergeConfig(max_generations_per_commit=per_commit)
        before_view = self._lsm(False)
        before = self._check_merged_monotonic()
        if up_to is None:
            summary = merge_table(MemWalTable(self.uri, self.so), config=config, dedup=self.dedup)
            assert not summary.failed_regions, [x.error for x in summary.regions]
            targets = {ri: None for ri in range(len(self.regions))}
        else:
            ri = r % len(self.regions)
            if not self._has_manifest(ri):
                return
            result = merge_region(self.uri, self.so, self.regions[ri], config, self.dedup, up_to_generation=up_to)
            assert result.error is None
            targets = {ri: up_to}
        merged = self._check_merged_monotonic()
        for ri, limit in targets.items():
            if not self._has_manifest(ri):
                continue
            region = self.regions[ri]
            highest = self._highest_flushed(ri)
            want = max(before.get(region, 0), highest if limit is None else min(limit, highest))
            assert merged.get(region, 0) == want, f"region {ri}: merged {merged.get(region, 0)}, expected {want}"
            type(self).stats["generations_merged"] += want - before.get(region, 0)
        assert self._lsm(False) == before_view, "a merge changed the LSM view"

    @precondition(lambda self: self._any_region())
    @rule()
    @_tracked
    def catch_up(self) -> None:
        summary = catchup_table(MemWalTable(self.uri, self.so))
        assert all(i.error is None and i.covered for i in summary.indexes), summary
        self._check_merged_monotonic()

    @precondition(lambda self: self._any_region())
    @rule(inline_threshold=st.sampled_from([0, 100]))
    @_tracked
    def snapshot(self, inline_threshold: int) -> None:
        summary = refresh_snapshot(MemWalTable(self.uri, self.so), inline_threshold=inline_threshold)
        store = self.store
        regions = sorted(list_regions(store))
        assert summary.num_regions == len(regions)
        snap = read_snapshot(MemWalTable(self.uri, self.so))
        got = {str(uuid.UUID(bytes=r["region_id"])): r for r in snap.to_pylist()} if snap is not None else {}
        assert sorted(got) == regions
        for region, row in got.items():
            m = load_latest_manifest(store, region)
            assert (row["version"], row["writer_epoch"], row["current_generation"]) == (
                m.version, m.writer_epoch, m.current_generation)
            assert [g["generation"] for g in row["flushed_generations"]] == [
                g.generation for g in m.flushed_generations]
        self._check_merged_monotonic()

    @precondition(lambda self: self._any_region())
    @rule(prepare=st.sampled_from(["none", "cleanup", "catch-up+cleanup", "merge+catch-up+cleanup"]),
          keep=st.integers(1, 3))
    @_tracked
    def gc(self, prepare: str, keep: int) -> None:
        """GC (grace period 0), often after (merge,) catch-up and Lance's cleanup_old_versions, so it deletes."""
        store = self.store
        cleanup = "cleanup" in prepare
        if prepare.startswith("merge"):
            merge_table(MemWalTable(self.uri, self.so), dedup=self.dedup)
            self._check_merged_monotonic()
        if "catch-up" in prepare:
            catchup_table(MemWalTable(self.uri, self.so))
        before_flushed, before_strong = self._lsm(False), self._lsm(True)
        unflushed = {}
        for ri, region in enumerate(self.regions):
            if self._has_manifest(ri):
                after = load_latest_manifest(store, region).replay_after_wal_entry_position
                unflushed[region] = [p for p in list_wal_positions(store, region) if p > after]
        if cleanup:
            lance.dataset(self.uri, storage_options=lance_storage_options(self.so)).cleanup_old_versions(
                older_than=timedelta(0))
        summary = gc_table(MemWalTable(self.uri, self.so),
                           config=GcConfig(grace_period_s=0, keep_manifest_versions=keep))
        assert not [r for r in summary.regions if r.error], [r.error for r in summary.regions]
        type(self).stats["gc_deleted_generations"] += sum(a.kind == "generation" for a in summary.actions)
        type(self).stats["gc_deleted_wal_entries"] += sum(a.kind == "wal_entry" for a in summary.actions)
        for region, positions in unflushed.items():
            left = set(list_wal_positions(store, region))
            assert set(positions) <= left, f"GC deleted unflushed WAL entries {set(positions) - left}"
        assert self._lsm(False) == before_flushed, "GC changed the flushed LSM view"
        assert self._lsm(True) == before_strong, "GC changed the strong LSM view"
        self._check_merged_monotonic()

    @precondition(lambda self: self._any_region())
    @rule(target_rows=st.sampled_from([4, 1000]), use_lock=st.booleans())
    @_tracked
    def compact(self, target_rows: int, use_lock: bool) -> None:
        """Forced compaction: the LSM view and merged_generations stay as they were; index_catchup keeps
        the entries of every index that still covers every fragment, and once a task is committed an index
        that no longer does (a compacted fragment mixed indexed rows with rows merged since its last
        catch-up, which Lance's remap leaves out) reads as not caught up (no entry, i.e. 0) until the next
        catch-up."""
        before_flushed, before_strong = self._lsm(False), self._lsm(True)
        index = load_index(self.uri, self.so).details
        summary = compact_table(MemWalTable(self.uri, self.so),
                                CompactionConfig(force=True, target_rows_per_fragment=target_rows, use_lock=use_lock))
        assert summary.error is None and summary.tasks_preempted == 0, summary.to_dict()
        type(self).stats["compaction_tasks"] += summary.tasks_committed
        after = load_index(self.uri, self.so).details
        assert dict(after.merged_generations) == dict(index.merged_generations), "compaction moved progress"
        covering = indexes_covering_every_fragment(
            lance.dataset(self.uri, storage_options=lance_storage_options(self.so)))
        # Nothing committed (Lance combines no indexed fragment with an unindexed one, and may have
        # nothing else to rewrite): index_catchup stays as it was.
        expected = {k: v for k, v in index.index_catchup.items() if k in covering or not summary.tasks_committed}
        assert _caught_up(after.index_catchup) == _caught_up(expected), (
            f"compaction changed index_catchup {dict(index.index_catchup)} -> {dict(after.index_catchup)} "
            f"(indexes covering every fragment: {sorted(covering)})")
        assert self._lsm(False) == before_flushed, "compaction changed the flushed LSM view"
        assert self._lsm(True) == before_strong, "compaction changed the strong LSM view"
        self._check_merged_monotonic()

    @precondition(lambda self: self._any_region())
    @rule(keep=st.integers(1, 3), then_gc=st.booleans())
    @_tracked
    def retain(self, keep: int, then_gc: bool) -> None:
        """Version retention (then GC): a time-travel LSM read at every retained version is unchanged."""
        ds = lance.dataset(self.uri, storage_options=lance_storage_options(self.so))
        newest = sorted(int(v["version"]) for v in ds.versions())[-keep:]
        before = {v: view(LsmReader(MemWalTable(self.uri, self.so), version=v).scan()) for v in newest}
        summary = retain_versions(MemWalTable(self.uri, self.so), RetentionConfig(older_than_s=0, keep_versions=keep))
        assert set(newest) <= set(summary.retained_versions), "the newest keep_versions versions stay"
        type(self).stats["retention_removed_versions"] += len(summary.versions_removed)
        if then_gc:
            gc = gc_table(MemWalTable(self.uri, self.so), config=GcConfig(grace_period_s=0))
            assert not [r for r in gc.regions if r.error], [r.error for r in gc.regions]
        for v in newest:
            got = view(LsmReader(MemWalTable(self.uri, self.so), version=v).scan())
            assert got == before[v], f"LSM read at retained version {v} changed"
        self._check_merged_monotonic()

    @precondition(lambda self: type(self).draw_schemas and not self.added and self._any_region())
    @rule()
    @_tracked
    def add_column(self) -> None:
        """A nullable column added to the base (all nulls, as Lance allows with a MemWAL attached) while
        writers hold MemTables and unflushed WAL; later puts carry it; the view is unchanged."""
        before = self._lsm(False)
        lance.dataset(self.uri, storage_options=lance_storage_options(self.so)).add_columns(
            {ADDED_COLUMN: "CAST(NULL AS BIGINT)"})
        self.added = True
        assert self._lsm(False) == before, "adding a column changed the LSM view"

    def _check_added_column(self, table: pa.Table, expected: dict[int, Row]) -> None:
        """ADDED_COLUMN per live key: the value written with it, null for rows written before it existed."""
        shadowed = {k for shadow in self.shadow for k in shadow}  # a stale write the reader cannot see yet
        got = {r["id"]: r[ADDED_COLUMN] for r in table.to_pylist() if r["id"] not in shadowed}
        want = {k: self.added_model.get(k) for k in expected if k not in shadowed}
        assert got == want, "the added column's values differ from the model"

    # -- reads -------------------------------------------------------------------------------------

    @rule(keys=st.lists(st.integers(0, KEYS - 1), max_size=3))
    @_tracked
    def read(self, keys: list[int]) -> None:
        self._recover_all()
        expected = self._expected_strong()
        reader = LsmReader(MemWalTable(self.uri, self.so), memtables=self._memtables())
        assert view(reader.scan()) == expected, "strong LSM read differs from the model"
        for k in keys:
            got = reader.get(self._key(k))
            want = expected.get(k)
            assert (None if got is None else (got["name"], got["score"])) == want, f"get({k})"
        if self.added:
            self._check_added_column(reader.scan(columns=["id", ADDED_COLUMN]), expected)
        ours = self._lsm(False)
        theirs = view(lance_core_scan(self.loc))
        assert ours == theirs, "Lance core's LsmScanner differs from our LsmReader over the flushed state"

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    @_tracked
    def manifests_and_progress(self) -> None:
        if self.loc is None or not self.check_every_step:
            return
        store = self.store
        for ri, region in enumerate(self.regions):
            if not self._has_manifest(ri):
                continue
            m = load_latest_manifest(store, region)
            assert m.writer_epoch == self.epochs[ri], (
                f"stored writer_epoch {m.writer_epoch} is not the newest claimed {self.epochs[ri]}")
            gens = [fg.generation for fg in m.flushed_generations]
            assert gens == sorted(set(gens)) and all(g < m.current_generation for g in gens), m
        self._check_merged_monotonic()

    # -- the end -----------------------------------------------------------------------------------

    def _final_check(self) -> None:
        """Recover and flush every region, merge everything: the base table must equal the model.

        A closing put into every region first makes the end certain to merge (through `dedup`) and to GC
        at least one generation per region, whatever the drawn steps did: those counts are asserted."""
        for ri in range(len(self.regions)):
            table, vals = self._rows([ri])  # key ri routes to region ri
            self._writer(ri).put(table)
            self.shadow[ri] = {}
            self._apply(vals)
        for ri in range(len(self.regions)):
            if self.writers[ri] is not None:
                self.writers[ri].close()
                self.writers[ri] = None
            if self._has_manifest(ri):
                w = self._open_writer(ri)  # replays stale writers' entries the closed writer never saw
                w.close()
        assert self._lsm(False) == self.model, "after recovery the LSM view differs from the model"
        assert view(lance_core_scan(self.loc)) == self.model, "Lance core's view differs from the model"
        before = self._check_merged_monotonic()
        summary = merge_table(MemWalTable(self.uri, self.so), dedup=self.dedup)
        assert not summary.failed_regions, [r.error for r in summary.regions]
        merged = self._check_merged_monotonic()
        for region in self.regions:  # every region has a manifest now (the closing put)
            assert merged.get(region, 0) == self._highest_flushed(self.regions.index(region))
            assert merged[region] > before.get(region, 0), f"the final merge merged nothing in {region}"
            type(self).stats["final_generations_merged"] += merged[region] - before.get(region, 0)
        base = lance.dataset(self.uri, storage_options=lance_storage_options(self.so))
        assert view(base.to_table()) == self.model, "the fully merged base table differs from the model"
        if self.added:
            self._check_added_column(base.to_table(columns=["id", ADDED_COLUMN]), self.model)
        base.cleanup_old_versions(older_than=timedelta(0))
        catchup_table(MemWalTable(self.uri, self.so))
        summary = gc_table(MemWalTable(self.uri, self.so),
                           config=GcConfig(grace_period_s=0, keep_manifest_versions=1))
        assert not [r for r in summary.regions if r.error], [r.error for r in summary.regions]
        deleted = {a.region_id for a in summary.actions if a.kind == "generation"}
        assert deleted == set(self.regions), (
            f"the final GC deleted no merged generation in {set(self.regions) - deleted}")
        type(self).stats["final_gc_deleted_generations"] += sum(a.kind == "generation" for a in summary.actions)
        assert self._lsm(False) == self.model, "after the final GC the LSM view differs from the model"
        self._check_merged_monotonic()


def local_machine(root: str | None = None) -> type[LsmMachine]:
    """The machine on fresh directories under root (a new temporary directory if None)."""
    root = root or tempfile.mkdtemp(prefix="memwal-model-")

    def new_location() -> Loc:
        return Loc(tempfile.mkdtemp(dir=root), None)

    def cleanup(loc: Loc) -> None:
        if os.path.isdir(loc.uri):
            shutil.rmtree(loc.uri, ignore_errors=True)

    return type(
        "LocalLsmMachine",
        (LsmMachine,),
        {"new_location": staticmethod(new_location), "cleanup_location": staticmethod(cleanup),
         "stats": Counter()},
    )


def s3_machine(bucket_uri: str, storage_options: dict[str, str]) -> type[LsmMachine]:
    """The machine on fresh prefixes below an S3 URI (e.g. a moto bucket)."""
    counter = iter(range(10**9))

    def new_location() -> Loc:
        return Loc(f"{bucket_uri.rstrip('/')}/seq{next(counter)}", storage_options)

    return type("S3LsmMachine", (LsmMachine,), {"new_location": staticmethod(new_location), "stats": Counter(),
                                                 "check_every_step": False})
