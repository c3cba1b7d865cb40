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
import re
import shutil
import uuid

import lance
import pyarrow as pa
import pytest

from memwal import naming, wal
from memwal.catchup import catchup_table
from memwal.cli import _THRESHOLDS
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

from support.maintenance import merge_region
from support.tables import SCHEMA, create_base, open_base, rows

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


FAILED, BAD_ARGUMENTS, PARTIAL = 1, 2, 3  # the exit status table of docs/jobs.md


def cli(*args: str) -> int:
    """The memwal command's exit status (argparse errors exit too): the table of docs/jobs.md, exactly
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
], ids=["unknown-uuid", "not-a-uuid", "empty"])  # fixed ids: xdist's workers must collect the same names
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
    # The library reports an unknown region as that region's failure; the commands refuse it as bad input.
    assert cli("merge", loc.uri, "--region", bogus) == BAD_ARGUMENTS
    assert cli("merge", loc.uri, "--region", bogus, "--up-to-generation", "1") == BAD_ARGUMENTS
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


# -- one contract for bad input: exit 2, one line naming the parameter and the value -------------------
# The same from `memwal` and every Spark entry point (spark_jobs/<job>.py), which refuses it before a
# Spark session exists.

UNKNOWN_REGION = "0b6e5f3c-1111-4222-8333-444455556666"


@pytest.fixture
def indexed_table(local_location):
    """Two regions, merged, and a scalar index `id_idx` on the base table."""
    a, b = two_regions(local_location)
    merge_table(local_location.uri)
    open_base(local_location).create_scalar_index("id", "BTREE", name="id_idx")
    return local_location, a, b


def entry_point(job: str, argv: list[str], capfd, monkeypatch) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines) of spark_jobs/<job>.py, with any Spark session refused."""
    import importlib

    from spark_jobs import common

    def no_spark(*args, **kwargs):
        raise AssertionError("bad input must be refused before a Spark session starts")

    monkeypatch.setattr(common, "build_spark", no_spark)
    capfd.readouterr()
    code = importlib.import_module(f"spark_jobs.{job}").main(argv)
    out, err = capfd.readouterr()
    return code, out, err.splitlines()


def command(argv: list[str], capfd) -> tuple[int, str, list[str]]:
    capfd.readouterr()
    code = cli(*argv)
    out, err = capfd.readouterr()
    return code, out, err.splitlines()


# (job, arguments after TABLE, what the one line must say); {region} is a region of the table.
BAD_INPUT = [
    # 13: the same bad argument, the same status and line from both
    ("merge", ["--up-to-generation", "2"], ["--up-to-generation 2", "exactly one --region"]),
    ("merge", ["--region", "{region}", "--region", "{other}", "--up-to-generation", "2"],
     ["--up-to-generation 2", "exactly one --region (got 2)"]),
    ("gc", ["--storage-option", "novalue"], ["--storage-option", "'novalue'", "KEY=VALUE"]),
    ("merge", ["--storage-options-json", "{bad"], ["--storage-options-json"]),
    ("merge", ["--storage-options-json", "[1, 2]"], ["--storage-options-json", "not a JSON object"]),
    ("merge", ["--storage-options-json", "@/nonexistent/s3.json"], ["--storage-options-json", "/nonexistent/s3.json"]),
    ("merge", ["--region", "bucket-3"], ["--region", "'bucket-3'", "not a UUID"]),
    # 16: an index that does not exist
    ("catchup", ["--index", "nosuch"], ["--index 'nosuch'", "no such index in table {table}", "its indexes: id_idx"]),
    # 17: --region where a job takes none; a region the table does not have
    ("catchup", ["--region", "{region}"], ["--region", "{region}", "catchup", "takes no --region"]),
    ("snapshot", ["--region", "{region}"], ["--region", "{region}", "snapshot", "takes no --region"]),
    ("compaction", ["--region", "{region}"], ["--region", "{region}", "compaction", "takes no --region"]),
    ("retention", ["--region", "{region}"], ["--region", "{region}", "retention", "takes no --region"]),
    ("merge", ["--region", UNKNOWN_REGION], [f"--region {UNKNOWN_REGION}", "no such region in table {table}"]),
    ("merge", ["--region", "{region}", "--region", UNKNOWN_REGION], [f"--region {UNKNOWN_REGION}", "{table}"]),
    ("gc", ["--region", UNKNOWN_REGION], [f"--region {UNKNOWN_REGION}", "no such region in table {table}"]),
    # 18: what the tables file refuses, the command line refuses; no non-finite number anywhere
    ("gc", ["--grace-period-s", "-100"], ["--grace-period-s", "-100.0 is negative"]),
    ("gc", ["--grace-period-s", "nan"], ["--grace-period-s", "nan is not a finite number"]),
    ("gc", ["--keep-manifest-versions", "0"], ["--keep-manifest-versions", "0 is not >= 1"]),
    ("snapshot", ["--inline-threshold", "-5"], ["--inline-threshold", "-5 is not >= 0"]),
    ("retention", ["--older-than-s", "1e11"], ["--older-than-s", "1e+11 is more than"]),
    ("retention", ["--older-than-s", "inf"], ["--older-than-s", "inf is not a finite number"]),
    ("retention", ["--older-than-s", "nan"], ["--older-than-s", "nan is not a finite number"]),
    ("retention", ["--keep-versions", "0"], ["--keep-versions", "0 is not >= 1"]),
    ("compaction", ["--max-deleted-ratio", "nan"], ["--max-deleted-ratio", "nan is not a finite number"]),
    ("compaction", ["--materialize-deletions-threshold", "1.5"], ["--materialize-deletions-threshold", "1.5"]),
    ("merge", ["--max-bytes-per-commit", "0"], ["--max-bytes-per-commit", "'0' is not >= 1 byte"]),
    ("merge", ["--max-generations-per-commit", "1.5"], ["--max-generations-per-commit", "'1.5' is not an integer"]),
]


def _fill(text: str, loc, a: str, b: str) -> str:
    return text.replace("{region}", a).replace("{other}", b).replace("{table}", loc.uri)


@pytest.mark.parametrize(("job", "args", "says"), BAD_INPUT,
                         ids=[f"{j}{''.join(a[:2])}" for j, a, _ in BAD_INPUT])
def test_bad_input_is_exit_2_and_one_line_from_memwal_and_the_spark_entry_point(
        indexed_table, capfd, monkeypatch, job, args, says):
    loc, a, b = indexed_table
    args = [_fill(x, loc, a, b) for x in args]
    before, version = files(loc), open_base(loc).version
    mine = command([job, loc.uri, *args], capfd)
    spark = entry_point(job, [loc.uri, *args], capfd, monkeypatch)
    for (code, out, err), prefix in ((mine, f"memwal {job}: error: "), (spark, f"memwal-{job}: error: ")):
        assert (code, out) == (BAD_ARGUMENTS, ""), (prefix, code, out, err)
        assert len(err) == 1 and err[0].startswith(prefix), err
        for text in says:
            assert _fill(text, loc, a, b) in err[0], (text, err[0])
        assert ".rs:" not in err[0] and "Traceback" not in err[0]
    assert mine[2][0].removeprefix(f"memwal {job}: error: ") == spark[2][0].removeprefix(f"memwal-{job}: error: ")
    assert_nothing_lost(before, loc)
    assert open_base(loc).version == version, "bad input commits nothing"


# `memwal status` (no Spark entry point): thresholds as the tables file and the lag monitor take them.
STATUS_BAD_INPUT = [
    (["--max-unmerged-generations", "-1"], ["--max-unmerged-generations", "-1 is not >= 0"]),
    (["--max-age-s", "-5"], ["--max-age-s", "-5.0 is negative"]),
    (["--max-age-s", "inf"], ["--max-age-s", "inf is not a finite number"]),
    (["--max-index-lag", "-2"], ["--max-index-lag", "-2 is not >= 0"]),
    (["--max-fragments", "-1"], ["--max-fragments", "-1 is not >= 0"]),
    (["--max-deleted-ratio", "-0.5"], ["--max-deleted-ratio", "-0.5 is not between 0 and 1"]),
    (["--max-table-versions", "-3"], ["--max-table-versions", "-3 is not >= 0"]),
    # 15: a health threshold without the health it is checked against
    (["--no-health", "--max-fragments", "5"], ["--max-fragments 5", "--no-health"]),
    (["--max-deleted-ratio", "0.2", "--no-health"], ["--max-deleted-ratio 0.2", "--no-health"]),
    (["--no-health", "--max-table-versions", "3"], ["--max-table-versions 3", "--no-health"]),
    # 17: a region the table does not have
    (["--region", UNKNOWN_REGION], [f"--region {UNKNOWN_REGION}", "no such region in table {table}"]),
]


@pytest.mark.parametrize(("args", "says"), STATUS_BAD_INPUT, ids=["".join(a) for a, _ in STATUS_BAD_INPUT])
def test_status_bad_input_is_exit_2_and_one_line(indexed_table, capfd, args, says):
    loc, a, b = indexed_table
    code, out, err = command(["status", loc.uri, *args], capfd)
    assert (code, out) == (BAD_ARGUMENTS, "") and len(err) == 1, (code, out, err)
    assert err[0].startswith("memwal status: error: ")
    for text in says:
        assert _fill(text, loc, a, b) in err[0], (text, err[0])


def test_status_help_says_thresholds_alert_with_exit_4(capsys):
    assert cli("status", "--help") == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("alert (exit 4)") == len(_THRESHOLDS) and "exit 3" not in text


@pytest.mark.parametrize("job", ["status", "merge", "catchup", "snapshot", "gc", "compaction", "retention"])
def test_a_missing_table_is_named_without_lance_internals(tmp_path, capfd, monkeypatch, job):
    """19: the table's own path (with its leading /), not Lance's text with Rust source locations."""
    missing = str(tmp_path / "nope.lance")
    runs = [(command([job, missing], capfd), f"memwal {job}: error: ")]
    if job != "status":
        runs.append((entry_point(job, [missing], capfd, monkeypatch), f"memwal-{job}: error: "))
    for (code, out, err), prefix in runs:
        assert (code, out) == (BAD_ARGUMENTS, "") and len(err) == 1, (code, out, err)
        assert err[0] == f"{prefix}table {missing} not found: no Lance dataset there; check the table URI and " \
                         "the storage options"
    assert not (tmp_path / "nope.lance").exists(), "nothing is created"


def test_run_job_refuses_bad_input_before_the_job_runs(indexed_table):
    """The same checks for library callers of `memwal.jobs.run_job` (the Airflow hook's in-process engine):
    BadInputError, and nothing committed (catch-up of an unknown index used to commit and report optimized)."""
    from memwal.errors import BadInputError
    from memwal.job_config import JobOptions
    from memwal.jobs import run_job
    from memwal.table import MemWalTable

    loc, a, _ = indexed_table
    version = open_base(loc).version
    table = MemWalTable(loc.uri)
    for job, options, regions, says in (
            ("catchup", JobOptions(indexes=("nosuch",)), None, "--index 'nosuch'"),
            ("snapshot", JobOptions(), [a], "takes no --region"),
            ("merge", JobOptions(), [UNKNOWN_REGION], f"--region {UNKNOWN_REGION}"),
            ("gc", JobOptions(), [UNKNOWN_REGION], f"--region {UNKNOWN_REGION}")):
        with pytest.raises(BadInputError, match=re.escape(says)):
            run_job(job, table, options, regions)
    assert open_base(loc).version == version
    assert run_job("catchup", table, JobOptions(indexes=("id_idx",)))["failed_indexes"] == []
