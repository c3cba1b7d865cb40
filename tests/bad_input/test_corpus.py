"""A corpus of broken inputs. Each must give a clear error that names the file / region / parameter, or be
skipped safely; and nothing may be lost: no existing file is modified or deleted by the attempt, and
the other (healthy) region is still merged / collected.

Decided and documented behaviours (where the spec leaves a choice):
- Manifest version gap (N missing, N+1 present): `latest_version` follows the spec (read the hint, probe
  forward, stop at the first missing version), so readers and jobs see version N-1: a consistent but stale
  view; nothing is deleted. A hint that points at a missing version falls back to listing (highest
  version). A writer must not claim into the gap: see test_regressions.py::test_writer_claim_fills_a_manifest_gap.
- A WAL entry whose writer_epoch is above every claimed epoch can only come from a newer writer (or
  be foreign): replay treats it as fenced (FencedError naming region and epochs) and leaves it alone.
- A table without MemWAL: every maintenance job and the table writer raise MemWalNotInitializedError
  naming the table; LsmReader reads the base table alone; a RegionWriter with an explicit region id works
  (a manual region, spec id 0), as Lance core allows.
"""

from __future__ import annotations

import json
import shutil
import uuid

import lance
import pyarrow as pa
import pytest
from maintenance import merge_region
from tables import SCHEMA, create_base, open_base, rows

from memwal import naming, wal
from memwal.catchup import catchup_table
from memwal.cli import main as cli_main
from memwal.errors import (
    CorruptFileError,
    FencedError,
    MemWalError,
    MemWalNotInitializedError,
    MissingGenerationError,
    NoPrimaryKeyError,
    RegionNotFoundError,
    RegionSpecError,
)
from memwal.gc import GcConfig, gc_table
from memwal.mem_wal_index import initialize_mem_wal, load_index
from memwal.merge import merge_table
from memwal.reader import LsmReader
from memwal.region_manifest import (
    decode_manifest,
    latest_version,
    list_manifest_versions,
    load_latest_manifest,
)
from memwal.region_spec import RegionField, RegionSpec
from memwal.schema import with_tombstone
from memwal.snapshot import read_snapshot, refresh_snapshot
from memwal.status import table_status
from memwal.table_writer import TableWriter
from memwal.writer import RegionWriter, WriterConfig

NEVER = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)


# -- helpers -------------------------------------------------------------------------------------------


def two_regions(loc, unflushed: bool = False) -> tuple[str, str]:
    """Regions a < b, each with two flushed generations (keys 100.. and 200..); optionally a crashed
    writer on a with two unflushed WAL entries (keys 150, 151)."""
    create_base(loc, ids=range(5))
    open_base(loc).initialize_mem_wal(unsharded=True)
    a, b = sorted(str(uuid.uuid4()) for _ in range(2))
    for region, k in ((a, 100), (b, 200)):
        with RegionWriter(loc.uri, region, storage_options=loc.storage_options, config=NEVER) as w:
            w.put(rows([k, k + 1], "g1"))
            w.flush()
            w.put(rows([k + 1, k + 2], "g2"))
            w.flush()
    if unflushed:
        w = RegionWriter(loc.uri, a, storage_options=loc.storage_options, config=NEVER)
        w.put(rows([150], "wal"))
        w.put(rows([151], "wal"))
        del w  # crashed: the entries stay in the WAL
    return a, b


def files(loc, prefix: str = naming.MEM_WAL_DIR) -> dict[str, bytes]:
    """Every object below prefix except version hints (best-effort pointers, rewritten by design)."""
    store = loc.store()
    return {m.path: store.get(m.path) for m in store.list(prefix) if not m.path.endswith(naming.VERSION_HINT)}


def assert_nothing_lost(before: dict[str, bytes], loc, prefix: str = naming.MEM_WAL_DIR) -> None:
    after = files(loc, prefix)
    gone = sorted(set(before) - set(after))
    changed = sorted(p for p in before if p in after and after[p] != before[p])
    assert not gone and not changed, f"deleted {gone}, modified {changed}"


FAILED, BAD_ARGUMENTS, PARTIAL = 1, 2, 3  # the README's exit status table


def cli(*args: str) -> int:
    """The memwal command's exit status (argparse errors exit too): the README's table, exactly
    (1 failed, 2 bad arguments, 3 some region or index failed)."""
    try:
        return cli_main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


# -- truncated WAL entry -------------------------------------------------------------------------------


def test_truncated_wal_entry_stops_writer_replay_with_the_file_named(local_location):
    loc = local_location
    a, b = two_regions(loc, unflushed=True)
    store = loc.store()
    replay_from = load_latest_manifest(store, a).replay_after_wal_entry_position + 1
    bad = naming.wal_entry_path(a, replay_from + 1)
    data = store.get(bad)
    store.put(bad, data[: len(data) // 2 + 3])
    before = files(loc)
    with pytest.raises(CorruptFileError) as err:
        RegionWriter(loc.uri, a, config=NEVER)
    assert bad in str(err.value) and "truncated" in str(err.value)
    assert_nothing_lost(before, loc)  # the failed claim added a manifest version, nothing else changed
    summary = merge_table(loc.uri)
    assert not summary.failed_regions, "the merge does not read the WAL: both regions merge"
    assert load_index(loc.uri).merged_generations == {a: 2, b: 2}
    assert ids(LsmReader(loc.uri).scan()) == [0, 1, 2, 3, 4, 100, 101, 102, 200, 201, 202]
    store.put(bad, data)  # an operator restores the file: recovery then replays everything
    with RegionWriter(loc.uri, a, config=NEVER) as w:
        assert w.stats.replayed_entries == 2
    assert 151 in ids(LsmReader(loc.uri).scan())


def test_truncated_wal_entry_in_snapshot_refresh_names_the_file(local_location):
    """Snapshot refresh samples a row of a region without flushed generations from its WAL."""
    loc = local_location
    create_base(loc, ids=range(3))
    open_base(loc).initialize_mem_wal(unsharded=True)
    region = str(uuid.uuid4())
    w = RegionWriter(loc.uri, region, config=NEVER)
    w.put(rows([7]))
    del w
    store = loc.store()
    path = naming.wal_entry_path(region, 1)
    store.put(path, store.get(path)[:100])
    with pytest.raises(CorruptFileError, match=path):
        refresh_snapshot(loc.uri)


# -- corrupt region manifest ---------------------------------------------------------------------------


@pytest.mark.parametrize("corruption", ["garbage", "truncated", "other_version", "other_region", "empty"])
def test_corrupt_region_manifest(local_location, corruption):
    loc = local_location
    a, b = two_regions(loc)
    store = loc.store()
    version = latest_version(store, a)
    path = naming.manifest_path(a, version)
    good = store.get(path)
    m = decode_manifest(good, path)
    bad = {
        "garbage": b"\xff\x00not a protobuf\x13\x37" * 3,
        "truncated": good[: len(good) - 7],
        "other_version": store.get(naming.manifest_path(a, version - 1)),
        "other_region": store.get(naming.manifest_path(b, latest_version(store, b))),
        "empty": b"",
    }[corruption]
    store.put(path, bad)
    before = files(loc)

    with pytest.raises(CorruptFileError) as err:
        load_latest_manifest(store, a)
    assert path in str(err.value)
    for attempt in (lambda: LsmReader(loc.uri), lambda: RegionWriter(loc.uri, a, config=NEVER),
                    lambda: refresh_snapshot(loc.uri)):
        with pytest.raises(CorruptFileError, match=path):
            attempt()

    summary = merge_table(loc.uri)
    errors = {r.region_id: r.error for r in summary.regions}
    assert path in errors[a] and errors[b] is None, errors
    assert load_index(loc.uri).merged_generations == {b: 2}, "the healthy region is still merged"
    gc = gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    assert path in {r.region_id: r.error for r in gc.regions}[a]
    status = {r.region_id: r for r in table_status(loc.uri).regions}
    assert path in status[a].error and status[b].error is None
    assert cli("merge", loc.uri) == PARTIAL, "one region failed, the other merged"
    assert_nothing_lost(before, loc)
    assert m.region_id == a


def test_every_truncation_of_a_region_manifest_is_detected(local_location):
    """region_id (field 11) is serialised last, so any cut loses it: no prefix parses as a manifest."""
    loc = local_location
    a, _ = two_regions(loc)
    store = loc.store()
    for version in list_manifest_versions(store, a):
        data = store.get(naming.manifest_path(a, version))
        for n in range(len(data)):
            with pytest.raises(CorruptFileError):
                decode_manifest(data[:n], f"v{version}[:{n}]")


# -- manifest version gap ------------------------------------------------------------------------------


def test_manifest_version_gap_readers_stop_at_the_gap(local_location):
    """Versions 1..N with N-2 deleted: probing from the hint stops before the gap (see module docstring)."""
    loc = local_location
    a, _ = two_regions(loc)
    store = loc.store()
    versions = list_manifest_versions(store, a)  # 1 claim, 2 and 3 flushes
    top = versions[-1]
    gap = top - 1
    store.delete(naming.manifest_path(a, gap))
    hint = naming.version_hint_path(a)
    before = files(loc)

    store.put(hint, json.dumps({"version": gap - 1}).encode())
    assert latest_version(store, a) == gap - 1, "probing from the hint stops at the first missing version"
    stale = load_latest_manifest(store, a)
    assert stale.version == gap - 1
    store.delete(hint)
    assert latest_version(store, a) == gap - 1, "no hint: probe from version 1"
    store.put(hint, json.dumps({"version": gap}).encode())
    assert latest_version(store, a) == top, "a hint at the missing version falls back to listing"
    store.put(hint, b"{not json")
    assert latest_version(store, a) == gap - 1

    # Readers and the merge see the stale (but consistent) state of version gap-1; nothing is deleted.
    store.put(hint, json.dumps({"version": gap - 1}).encode())
    view = ids(LsmReader(loc.uri).scan())
    assert {200, 201, 202} <= set(view)
    listed = {fg.generation for fg in stale.flushed_generations}
    summary = merge_table(loc.uri)
    assert not summary.failed_regions
    assert load_index(loc.uri).merged_generations.get(a, 0) == max(listed, default=0)
    assert_nothing_lost(before, loc)


# -- WAL entry with a writer_epoch above the manifest's ------------------------------------------------


def test_wal_entry_from_a_higher_epoch_is_fenced_on_replay(local_location):
    loc = local_location
    a, _ = two_regions(loc, unflushed=True)
    store = loc.store()
    m = load_latest_manifest(store, a)
    last = max(wal.list_wal_positions(store, a))
    foreign = wal.encode_wal_entry(with_tombstone(rows([999], "future"), SCHEMA, False),
                                   writer_epoch=m.writer_epoch + 5, generation=m.current_generation)
    wal.write_wal_entry(store, a, last + 1, foreign)
    before = files(loc)
    with pytest.raises(FencedError) as err:
        RegionWriter(loc.uri, a, config=NEVER)
    assert a in str(err.value) and str(m.writer_epoch + 5) in str(err.value)
    assert_nothing_lost(before, loc)
    gens = {fg.generation for fg in load_latest_manifest(store, a).flushed_generations}
    assert gens == {1, 2}, "nothing of the replay was flushed"
    assert 999 not in ids(LsmReader(loc.uri).scan())
    assert not merge_table(loc.uri).failed_regions, "merging flushed generations is unaffected"


# -- generation directory deleted under a reader -------------------------------------------------------


def test_generation_directory_deleted_under_a_reader(local_location):
    loc = local_location
    a, b = two_regions(loc)
    store = loc.store()
    gen2 = load_latest_manifest(store, a).generation_path(2)
    reader = LsmReader(loc.uri)  # opened every source
    shutil.rmtree(f"{loc.uri}/{naming.generation_dir(a, gen2)}")
    with pytest.raises(Exception) as err:
        reader.scan()
    assert gen2 in str(err.value), f"the error must name the generation directory: {err.value}"
    with pytest.raises(MissingGenerationError) as err2:
        LsmReader(loc.uri)
    assert err2.value.region_id == a and err2.value.generation == 2 and gen2 in str(err2.value)
    before = files(loc)
    summary = merge_table(loc.uri)
    errors = {r.region_id: r.error for r in summary.regions}
    assert "generation 2" in errors[a] and a in errors[a] and errors[b] is None
    merged = load_index(loc.uri).merged_generations
    assert merged[b] == 2 and merged.get(a, 0) < 2, "region a stops before the missing generation"
    status = {r.region_id: r for r in table_status(loc.uri).regions}
    assert gen2 in status[a].error
    gc = gc_table(loc.uri, config=GcConfig(grace_period_s=0))
    assert not [r for r in gc.regions if r.error]
    assert [x for x in gc.actions if x.kind == "generation"] == [], "nothing is merged-and-covered enough"
    assert_nothing_lost(before, loc)


# -- table without MemWAL ------------------------------------------------------------------------------


def test_every_job_on_a_table_without_memwal(local_location):
    loc = local_location
    create_base(loc, ids=range(3))
    region = str(uuid.uuid4())
    jobs = {
        "merge_table": lambda: merge_table(loc.uri),
        "merge_region": lambda: merge_region(loc.uri, None, region),
        "catchup": lambda: catchup_table(loc.uri),
        "snapshot": lambda: refresh_snapshot(loc.uri),
        "read_snapshot": lambda: read_snapshot(loc.uri),
        "gc": lambda: gc_table(loc.uri),
        "status": lambda: table_status(loc.uri),
        "load_index": lambda: load_index(loc.uri),
        "table_writer": lambda: TableWriter(loc.uri),
    }
    for name, job in jobs.items():
        with pytest.raises(MemWalNotInitializedError) as err:
            job()
        assert loc.uri in str(err.value) and "initialise" in str(err.value), name
    for command in ("merge", "catchup", "snapshot", "gc", "status"):
        assert cli(command, loc.uri) == FAILED, command
    assert ids(LsmReader(loc.uri).scan()) == [0, 1, 2], "the LSM reader reads the base table alone"
    with RegionWriter(loc.uri, region, config=NEVER) as w:  # a manual region (spec id 0)
        w.put(rows([9]))
    assert load_latest_manifest(loc.store(), region).region_spec_id == 0
    assert ids(LsmReader(loc.uri).scan()) == [0, 1, 2, 9]
    with pytest.raises(MemWalNotInitializedError):
        merge_table(loc.uri)
    assert open_base(loc).version == 1, "no job committed anything"


# -- unknown region id ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bogus", [
    str(uuid.uuid4()),
    "not-a-uuid",
    "",
])
def test_unknown_region_for_merge_and_gc(local_location, bogus):
    loc = local_location
    _, b = two_regions(loc)
    before = files(loc)
    summary = merge_table(loc.uri, regions=[bogus, b])
    errors = {r.region_id: r.error for r in summary.regions}
    reason = "no manifest" if len(bogus) == 36 else "is not a UUID"
    assert errors[bogus] and reason in errors[bogus] and bogus in errors[bogus], "the error names the region id"
    assert errors[b] is None
    assert load_index(loc.uri).merged_generations == {b: 2}, "the known region is still merged"
    gc = gc_table(loc.uri, regions=[bogus], config=GcConfig(grace_period_s=0))
    assert len(gc.regions) == 1 and reason in (gc.regions[0].error or "")
    with pytest.raises((RegionNotFoundError, MemWalError)) as err:
        merge_region(loc.uri, None, bogus)
    assert bogus in str(err.value)
    code = PARTIAL if len(bogus) == 36 else BAD_ARGUMENTS  # a well-formed unknown id fails its region only
    assert cli("merge", loc.uri, "--region", bogus) == code
    assert cli("merge", loc.uri, "--region", bogus, "--up-to-generation", "1") == code
    assert_nothing_lost(before, loc)


# -- schema without a primary key ----------------------------------------------------------------------


def test_schema_without_primary_key(local_location):
    loc = local_location
    plain = pa.table({"id": [1, 2], "name": ["a", "b"]})
    lance.write_dataset(plain, loc.uri)
    region = str(uuid.uuid4())
    for attempt in (lambda: RegionWriter(loc.uri, region, config=NEVER),
                    lambda: initialize_mem_wal(loc.uri, None, None),
                    lambda: LsmReader(loc.uri)):
        with pytest.raises(NoPrimaryKeyError) as err:
            attempt()
        assert loc.uri in str(err.value) and "unenforced-primary-key" in str(err.value)
        assert "id" in str(err.value), "the message lists the columns"
    assert loc.store().list(naming.MEM_WAL_DIR) == [], "the writer claimed nothing"
    assert open_base(loc).version == 1


# -- region spec with an unknown transform -------------------------------------------------------------


def test_region_spec_with_an_unknown_transform(local_location):
    with pytest.raises(RegionSpecError) as err:
        RegionField("shard", (0,), "zorder", None, "int32")
    assert "'shard'" in str(err.value) and "'zorder'" in str(err.value) and "bucket" in str(err.value)
    with pytest.raises(RegionSpecError, match="num_buckets"):
        RegionField("b", (0,), "bucket", None, "int32", {"num_buckets": "ten"})
    from memwal._proto import memwal_pb2

    msg = memwal_pb2.RegionSpec(spec_id=3)
    f = msg.fields.add()
    f.field_id, f.transform, f.result_type = "shard", "zorder", "int32"
    f.source_ids.append(0)
    with pytest.raises(RegionSpecError, match="zorder"):
        RegionSpec.from_proto(msg)
