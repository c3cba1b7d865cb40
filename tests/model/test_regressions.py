"""Regression tests for the bugs the model-based, crash, race and bad-input tests found.

Each docstring draws the scenario that lost or corrupted data (or blocked the jobs) before the fix.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta

import pyarrow as pa
import pytest

from memwal import naming, wal
from memwal.errors import CorruptFileError, FencedError
from memwal.gc import GcConfig, gc_table
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import latest_version, list_manifest_versions, load_manifest
from memwal.schema import with_tombstone
from memwal.snapshot import refresh_snapshot
from memwal.table import MemWalTable
from memwal.writer import RegionWriter, WriterConfig

from support.maintenance import build_table, merge_region, merge_without_our_lock
from support.tables import SCHEMA, create_base, open_base, rows

NEVER = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)


def _ids(loc) -> list[int]:
    return sorted(LsmReader(MemWalTable(loc.uri, loc.storage_options)).scan().column("id").to_pylist())


def _table(loc):
    create_base(loc, ids=range(3))
    open_base(loc).initialize_mem_wal(unsharded=True)
    return str(uuid.uuid4())


def test_stale_writer_put_into_gc_hole_is_lost(local_location):
    """
    A (epoch 1) writes position 1. B takes over (epoch 2), writes position 2, flushes (replay_after 2).
    Merge, Lance cleanup, GC: WAL positions 1..2 are deleted. A.put -> position 2 is free again -> created,
    acknowledged. Replay starts at 3: the acknowledged row is lost.
    Fix: after creating position P > 1, if P-1 does not exist, load the manifest; if P <= its
    replay_after_wal_entry_position the entry will never be replayed: abort and raise FencedError.
    """
    loc = local_location
    region = _table(loc)
    a = RegionWriter(loc.uri, region, config=NEVER)
    a.put(rows([10], "a"))
    b = RegionWriter(loc.uri, region, config=NEVER)
    b.put(rows([11], "b"))
    b.close()
    merge_table(loc.uri)
    open_base(loc).cleanup_old_versions(older_than=timedelta(0))
    gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    store = loc.store()
    assert [p for p in (1, 2) if store.exists(naming.wal_entry_path(region, p))] == [], \
        "GC removed WAL entries 1..2: the hole the stale put falls into"
    acknowledged = True
    try:
        a.put(rows([12], "stale"))
    except FencedError:
        acknowledged = False
    RegionWriter(loc.uri, region, config=NEVER).close()
    assert not acknowledged or 12 in _ids(loc), "an acknowledged put was lost"


def test_reader_sees_rows_merged_while_it_opens(local_location, monkeypatch):
    """
    The reader opens the base table at V (generation 1 unmerged), a merger commits V+1 (merged 1), then the
    reader loads the index at V+1, skips generation 1 and reads base V: row 10 is missing.
    Fix (reader.py): the index of the very base version it scans (now MemWalTable.index, loaded from the
    handle's dataset at its version).
    """
    import memwal.table as table_mod

    loc = local_location
    region = _table(loc)
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(rows([10], "g1"))
    real = table_mod.index_of
    merged = []

    def merge_meanwhile(*args, **kwargs):
        if not merged:  # once: the merge below loads the index too
            merged.append(True)
            merge_region(loc.uri, None, region)
        return real(*args, **kwargs)

    monkeypatch.setattr(table_mod, "index_of", merge_meanwhile)
    assert 10 in _ids(loc)


def test_snapshot_refresh_races_gc(local_location, monkeypatch):
    """
    snapshot._one_row opens the oldest listed generation and reads one row; GC removes it in between
    (seen in tests/concurrency/test_races.py): to_table raises ArrowInvalid/OSError, which _one_row does not
    catch (it only catches MemWalError from open_generation), so the whole refresh fails.
    Fix (snapshot.py _one_row): catch (MemWalError, OSError, pa.ArrowException) around open + to_table.
    """
    import memwal.snapshot as snapshot_mod

    loc = local_location
    build_table(loc, regions=1, generations=2)
    real = snapshot_mod.open_generation
    collected: list[str] = []

    def open_then_collected(store, region_id, generation, dir_name):
        ds = real(store, region_id, generation, dir_name)
        if not collected:
            collected.append(dir_name)
            store.delete_prefix(f"{naming.generation_dir(region_id, dir_name)}/data")  # GC, meanwhile
        return ds

    monkeypatch.setattr(snapshot_mod, "open_generation", open_then_collected)
    assert refresh_snapshot(loc.uri).num_regions == 1


def test_stale_merge_in_the_details_rebase_window_loses_an_update(local_location, monkeypatch):
    """
    Generations 1..3 of one region update key 10; merged 1.
    - merger X reads merged=1 and prepares generation 2;
    - snapshot refresh (commit_details) reads the index (merged 1); merger Y merges 2..3 (merged 3);
    - the details commit is rebased by Lance over Y's commit and records merged 1 again (INTEROP hazard);
    - before commit_details' repair, X commits generation 2: Lance compares with the regressed 1 and accepts;
    - the repair restores merged 3, but the base table holds generation 2's row: generation 3's update is
      lost for every reader (generations <= 3 are skipped as merged).
    The monotone load_index does not help: the stale-marker check is Lance core's, on the raw value.
    Fix: the MemWAL index lock (memwal.lock). A rewrite holds it from its read to its verified commit and
    every merge commit takes it, so Y and X both wait; the rewrite is never rebased over our merges.
    """
    import memwal.lock as lock_mod
    import memwal.mem_wal_index as mwi
    import memwal.merge as merge_mod
    import memwal.snapshot as snapshot_mod
    import memwal.table as table_module
    from memwal.merge import local_dedup, pending_generations
    from memwal.primary_key import primary_key_columns

    loc = local_location
    region = _table(loc)
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        for g in (1, 2, 3):
            w.put(rows([10], f"g{g}."))
            w.flush()
    merge_region(loc.uri, None, region, up_to_generation=1)
    store = loc.store()
    schema = open_base(loc).schema
    pk = primary_key_columns(schema)
    x_data = local_dedup(pending_generations(MemWalTable(loc.uri), region, 1)[:1], pk, schema, store)  # merger X
    outcome: dict[str, object] = {}
    threads: dict[str, threading.Thread] = {}

    def merger_x() -> None:
        try:
            merge_mod._commit(MemWalTable(loc.uri), [(region, 2)], x_data)
            outcome["x"] = "committed"
        except OSError as exc:
            outcome["x"] = f"refused: {exc}"

    # "Blocked" is observed, not timed: the thread read the lock and found it held by another owner (the
    # rewrite, which holds it until this hook returns), and has not finished.
    waiting: dict[str, threading.Event] = {}
    real_latest = lock_mod.TableLock._latest

    def observed_latest(self):
        state = real_latest(self)
        seen = waiting.get(threading.current_thread().name)
        if seen is not None and state is not None and not state.released and state.owner != self.owner:
            seen.set()
        return state

    monkeypatch.setattr(lock_mod.TableLock, "_latest", observed_latest)

    def start(name, target):
        waiting[name] = threading.Event()
        threads[name] = threading.Thread(target=target, name=name)
        threads[name].start()
        while not waiting[name].wait(0.05) and threads[name].is_alive():
            pass
        outcome[f"{name}_blocked"] = waiting[name].is_set() and threads[name].is_alive() and name not in outcome

    real_op = mwi.create_index_op

    def merger_y_while_rewriting(*args, **kwargs):
        if "y" not in threads:  # merger Y (another process) tries to merge 2..3 mid-rewrite
            start("y", lambda: merge_region(loc.uri, None, region))
        return real_op(*args, **kwargs)

    def merger_x_in_window(name):
        if name == "details.after_commit" and "x" not in threads:  # stale merger X tries to commit now
            start("x", merger_x)

    monkeypatch.setattr(mwi, "create_index_op", merger_y_while_rewriting)
    monkeypatch.setattr(table_module, "fault_point", merger_x_in_window)  # the commit loop lives with the handle
    snapshot_mod.refresh_snapshot(loc.uri)
    for t in threads.values():
        t.join(timeout=60)
    assert outcome["y_blocked"] and outcome["x_blocked"], "merge commits wait while a rewrite holds the index lock"
    assert mwi.load_index(loc.uri, monotone=False).merged_generations[region] == 3
    assert LsmReader(loc.uri).get(10)["name"] == "g3.10", "generation 3's update must win"


def test_writer_claim_fills_a_manifest_gap(local_location):
    """
    Region manifest versions 1..4 (epoch 1), version 3 missing, hint 2. latest_version stops at 2, so a new
    writer claims version 3 with epoch 2 based on version 2; version 4 (epoch 1) is latest again: the old
    writer is never fenced, and the new writer's flush re-uses generation numbers.
    Fix (region_manifest.latest_version(refuse_gap=True), used by every manifest commit): list the manifest
    directory after probing; a version above the probed latest is a race (probe again) unless the gap is
    confirmed (still missing while the version below it exists): then CorruptFileError naming the region and
    the missing version. Races: tests/concurrency/test_listing_races.py.
    """
    loc = local_location
    region = _table(loc)
    store = loc.store()
    w1 = RegionWriter(loc.uri, region, config=NEVER)
    for k in (10, 11, 12):
        w1.put(rows([k]))
        w1.flush()
    existing = list_manifest_versions(store, region)
    store.delete(naming.manifest_path(region, 3))
    store.put(naming.version_hint_path(region), json.dumps({"version": 2}).encode())
    try:
        w2 = RegionWriter(loc.uri, region, config=NEVER)
    except CorruptFileError as exc:
        assert region in str(exc)
        return
    assert w2.manifest.version > max(existing), "the claim went into the gap, below the latest version"
    assert load_manifest(store, region, latest_version(store, region)).writer_epoch == w2.writer_epoch


def test_truncated_wal_entry_at_a_message_boundary(local_location):
    """
    decode_wal_entry accepts an IPC stream cut after the schema message (0 rows) or after a record batch
    without the end-of-stream marker. On replay the acknowledged rows of that entry vanish silently.
    Both our writer and Lance core end every entry with the 8-byte EOS marker ffffffff00000000.
    Fix (wal.decode_wal_entry): raise CorruptFileError unless the data ends with that marker,
    b"\\xff\\xff\\xff\\xff\\x00\\x00\\x00\\x00".
    """
    table = pa.concat_tables([with_tombstone(rows([1, 2, 3]), SCHEMA, False)] * 2)
    data = wal.encode_wal_entry(table, writer_epoch=1, generation=1)
    accepted = []
    for n in range(len(data)):
        try:
            entry = wal.decode_wal_entry(data[:n], "entry", 1)
        except CorruptFileError:
            continue
        if entry.table.num_rows < table.num_rows:
            accepted.append((n, entry.table.num_rows))
    assert accepted == [], f"truncations accepted with rows missing (length, rows): {accepted}"


def test_wal_entry_with_the_claimed_epoch_is_not_fenced(local_location):
    """
    Manifest epoch 1; a WAL entry with epoch 2 (higher than the manifest's) appears after the writer's
    entries. The next writer claims epoch 2 and takes the entry as its own, though no writer could have
    written epoch 2 before that claim (a foreign or corrupt entry). Replay should treat an entry with an
    epoch >= its own as fenced (FencedError), as it does for higher ones.
    Fix (writer._take_entry during replay): `if entry.writer_epoch >= self.writer_epoch`.
    """
    loc = local_location
    region = _table(loc)
    w = RegionWriter(loc.uri, region, config=NEVER)
    w.put(rows([10]))
    del w
    store = loc.store()
    foreign = wal.encode_wal_entry(with_tombstone(rows([99], "foreign"), SCHEMA, False), writer_epoch=2,
                                   generation=1)
    wal.write_wal_entry(store, region, 2, foreign)
    with pytest.raises(FencedError):
        RegionWriter(loc.uri, region, config=NEVER)


def test_unknown_transform_in_the_index_blocks_merge_gc_and_reads(local_location):
    """
    decode_details validates region specs eagerly, so load_index raises RegionSpecError (naming neither the
    table nor the spec id) for a spec written by a newer Lance core; merge, GC and LsmReader, which never
    evaluate specs, all fail. Only routing writers (and snapshot region fields) need the spec.
    """
    import lance
    from lance.dataset import Index

    import memwal.mem_wal_index as mwi
    from memwal._proto import memwal_pb2

    loc = local_location
    region = _table(loc)
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        w.put(rows([10]))
    index = mwi.load_index(loc.uri)
    msg = memwal_pb2.MemWalIndexDetails()
    msg.ParseFromString(index.details.raw)
    msg.region_specs[0].fields[0].transform = "zorder"
    new = Index(uuid=str(uuid.uuid4()), name=naming.MEM_WAL_INDEX_NAME, fields=[],
                dataset_version=index.table_version, fragment_ids=set(), index_version=0,
                index_details=(naming.MEM_WAL_DETAILS_TYPE_URL, msg.SerializeToString()))
    old = Index(uuid=index.entry_uuid, name=naming.MEM_WAL_INDEX_NAME, fields=[],
                dataset_version=index.entry_dataset_version, fragment_ids=set(), index_version=0)
    lance.LanceDataset.commit(loc.uri, lance.LanceOperation.CreateIndex(new_indices=[new], removed_indices=[old]),
                              read_version=index.table_version)
    assert 10 in _ids(loc)
    assert not merge_table(loc.uri).failed_regions
    assert not [r for r in gc_table(loc.uri).regions if r.error]


def test_load_index_fails_after_cleanup_of_a_rebased_over_version(local_location, monkeypatch):
    """
    A snapshot refresh's details commit is rebased over a merge (version 4) and repaired (5: CreateIndex,
    6: repair). Lance's cleanup_old_versions then removes version 4 (older than its threshold) but keeps
    5 and 6. For the next 16 versions load_index(monotone=True) re-reads every version a CreateIndex
    skipped (_progress_floor -> read_details_at(4)) and raises FileNotFoundError: merge, GC, catch-up,
    snapshot refresh and LsmReader all fail. Seen in tests/concurrency/test_races.py on S3.
    Fix (mem_wal_index._progress_floor, and the `skipped` list in commit_details): skip versions whose
    manifest is gone (`except FileNotFoundError: continue`), as gc._retained_progress already does.
    """
    import memwal.mem_wal_index as mwi

    loc = local_location
    region = _table(loc)
    with RegionWriter(loc.uri, region, config=NEVER) as w:
        for k in (10, 11):
            w.put(rows([k]))
            w.flush()
    merge_region(loc.uri, None, region, up_to_generation=1)
    real_op = mwi.create_index_op
    merged: list[bool] = []

    def merge_first(*args, **kwargs):
        if not merged:
            merged.append(True)
            merge_without_our_lock(loc.uri, None, region)  # lands between the details read and its commit
        return real_op(*args, **kwargs)

    monkeypatch.setattr(mwi, "create_index_op", merge_first)
    refresh_snapshot(loc.uri)
    monkeypatch.undo()
    merge_version = open_base(loc).version - 2
    for path in mwi._manifest_paths(merge_version):  # what cleanup_old_versions does to an old version
        loc.store().delete(path)
    assert mwi.load_index(loc.uri).merged_generations[region] == 2
    assert 11 in _ids(loc)
