"""spark_dedup on a local[2] SparkSession commits exactly what local_dedup commits, keeps the driver free
of upserts (staged files, streamed), and leaves no staging files behind, also when a commit or the Spark
job fails. The job entry point's in-process paths (usage errors, a failed region, --up-to-generation)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import uuid
from dataclasses import asdict

import lance
import pyarrow as pa
import pytest
from spark_helpers import ONE_GEN_PER_FLUSH, Loc, base_rows, build_table, lsm_view

from memwal import merge as merge_mod
from memwal import region_batch
from memwal import staged_files as staged_files_module
from memwal.mem_wal_index import load_index
from memwal.merge import MergeConfig, merge_table
from memwal.writer import RegionWriter
from spark_jobs import merge as merge_job
from spark_jobs import merge_dedup, merge_shuffle
from spark_jobs.merge_dedup import STAGING_DIR, spark_dedup

from support.tables import open_base

pytestmark = pytest.mark.spark

_VOLATILE = {"duration_s"}


def _results(summary):
    return [{k: v for k, v in asdict(r).items() if k not in _VOLATILE} for r in summary.regions]


def test_spark_dedup_commits_what_local_dedup_commits(spark, tmp_path, monkeypatch):
    a = Loc(str(tmp_path / "a"))
    build_table(a, n_regions=2)
    b = Loc(str(tmp_path / "b"))
    shutil.copytree(a.uri, b.uri)
    before = lsm_view(a)
    config = MergeConfig(max_generations_per_commit=3)  # two commits per region

    local = merge_table(a.uri, config=config)
    staged_files = []
    real_open = staged_files_module.open_staged

    def open_staged(store, paths, schema):
        staged_files.append(len(paths))
        return real_open(store, paths, schema)

    for module in (region_batch, merge_shuffle):  # where a staged MergeInput opens its files
        monkeypatch.setattr(module, "open_staged", open_staged)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")  # many batches: many staged files
    try:
        on_spark = merge_table(b.uri, config=config, dedup=spark_dedup(spark, file_bytes=1))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert max(staged_files) > 3, "the commit must read its upserts from several staged files"

    assert not on_spark.failed_regions
    assert [r.generations for r in on_spark.regions] == [[1, 2, 3, 4, 5]] * 2
    assert _results(on_spark) == _results(local), "same generations, commits, rows read/upserted/deleted"
    assert base_rows(b) == base_rows(a) == before, "the merged base table must equal the LSM view before it"
    assert open_base(b).schema == open_base(a).schema
    assert on_spark.table_version_after == local.table_version_after
    assert load_index(b.uri).merged_generations == load_index(a.uri).merged_generations
    assert b.store().list(STAGING_DIR) == [], "the staging prefix must be gone after the merge"


SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"}),
    pa.field("vec", pa.list_(pa.float32(), 3)),
    pa.field("big", pa.uint64()),
    pa.field("small", pa.uint8()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("day", pa.date32()),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("blob", pa.binary()),
])


def _typed_rows(ids, k):
    n = len(ids)
    return pa.table({
        "id": ids,
        "vec": pa.array([[float(i), float(k), 0.5] for i in ids], SCHEMA.field("vec").type),
        "big": pa.array([2**64 - 1 - i - k for i in ids], pa.uint64()),
        "small": pa.array([(i + k) % 256 for i in ids], pa.uint8()),
        "ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=i + k) for i in ids],
                       SCHEMA.field("ts").type),
        "day": pa.array([dt.date(2026, 1, 1) + dt.timedelta(days=i) for i in ids], pa.date32()),
        "tags": [[f"t{i}", None] if i % 2 else [] for i in ids],
        "blob": [bytes([i % 256, k]) for i in ids],
    }, schema=SCHEMA).slice(0, n)


@pytest.mark.parametrize("task_bytes", [merge_dedup.DEFAULT_TASK_BYTES, 0], ids=["one-task-per-batch", "shuffle"])
def test_column_types_survive_the_trip_through_spark(spark, tmp_path, task_bytes):
    """Spark has no unsigned ints or fixed-size lists: values come back exact, whether a region batch is
    deduplicated by one task (pyarrow only) or spread by a shuffle (values cross in wider Spark types)."""
    a = Loc(str(tmp_path / "a"))
    lance.write_dataset(_typed_rows(list(range(5)), 0), a.uri)
    open_base(a).initialize_mem_wal(unsharded=True)
    with RegionWriter(a.uri, str(uuid.uuid4()), config=ONE_GEN_PER_FLUSH) as w:
        for k in (1, 2):
            w.put(_typed_rows([1, 2, 7 + k], k))
            w.flush()
        w.delete(pa.table({"id": pa.array([3], pa.int64())}))
        w.flush()
    b = Loc(str(tmp_path / "b"))
    shutil.copytree(a.uri, b.uri)
    merge_table(a.uri)
    summary = merge_table(b.uri, dedup=spark_dedup(spark, task_bytes=task_bytes))
    assert not summary.failed_regions
    ta, tb = open_base(a).to_table().sort_by("id"), open_base(b).to_table().sort_by("id")
    assert tb.schema == ta.schema
    assert tb.equals(ta), "every value must come back exactly as local_dedup commits it"
    assert tb.column("id").to_pylist() == [0, 1, 2, 4, 8, 9]


@pytest.mark.parametrize("task_bytes", [merge_dedup.DEFAULT_TASK_BYTES, 0], ids=["one-task-per-batch", "shuffle"])
def test_staging_is_removed_after_failed_commits(spark, tmp_path, monkeypatch, task_bytes):
    """Upserts and deleted keys both staged (the driver gets paths and counts), re-readable for a retry,
    and every attempt's staging removed."""
    loc = Loc(str(tmp_path / "t"))
    build_table(loc, n_regions=1)
    version = open_base(loc).version
    attempts = []

    def failing_commit(table, markers, data, since=None, *apply):
        staged = loc.store().list(STAGING_DIR)
        first, again = data.open_upserts(), data.open_upserts()
        deleted = data.open_deleted(table.store)
        attempts.append((len(staged), first.num_rows, data.deleted_rows, deleted.num_rows))
        assert staged and first.equals(again), "the staged upserts must be re-readable for a retry"
        assert data.staged_deleted and data.deleted_keys.num_rows == 0, "staged batches stage their deletes too"
        assert deleted.num_rows == data.deleted_rows > 0 and deleted.schema.names == list(table.primary_key)
        assert first.schema == table.schema
        raise OSError("injected commit failure")

    monkeypatch.setattr(merge_mod, "_commit", failing_commit)
    summary = merge_table(loc.uri, config=MergeConfig(max_attempts=2),
                          dedup=spark_dedup(spark, inline_bytes=0, task_bytes=task_bytes))  # staged, not inline
    assert len(attempts) == 2 and attempts[0] == attempts[1]
    assert "injected commit failure" in summary.regions[0].error
    assert loc.store().list(STAGING_DIR) == [], "every attempt's staging prefix must be deleted"
    assert open_base(loc).version == version, "nothing was committed"


@pytest.mark.parametrize("task_bytes", [merge_dedup.DEFAULT_TASK_BYTES, 0], ids=["one-task-per-batch", "shuffle"])
def test_each_staged_file_is_one_record_batch(spark, tmp_path, monkeypatch, task_bytes):
    """Spark hands the writer a few rows at a time; a staged file is still one record batch, so a scan task of
    the fragment apply reads its key column zero-copy instead of copying every key of the backlog."""
    loc = Loc(str(tmp_path / "t"))
    build_table(loc, n_regions=1)
    files = []

    def inspecting_commit(table, markers, data, since=None, *apply):
        for path in (*data.staged, *data.staged_deleted):
            f = pa.ipc.open_file(pa.py_buffer(table.store.get(path)))
            files.append((path, f.num_record_batches, f.read_all().num_rows))
        raise OSError("inspected")

    monkeypatch.setattr(merge_mod, "_commit", inspecting_commit)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    try:
        merge_table(loc.uri, config=MergeConfig(max_attempts=1),
                    dedup=spark_dedup(spark, inline_bytes=0, task_bytes=task_bytes))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert files and all(batches == 1 for _, batches, _ in files), files
    assert max(rows for *_, rows in files) > 2, "a file holds rows of several of Spark's batches"


def test_a_failed_spark_job_removes_its_staging_and_fails_only_that_region(spark, tmp_path):
    loc = Loc(str(tmp_path / "t"))
    good, bad = build_table(loc, n_regions=2)
    store = loc.store()
    data_files = [m.path for m in store.list(f"_mem_wal/{bad}") if "_gen_2/data/" in m.path]
    assert data_files
    for path in data_files:  # the manifest still lists it: the driver plans, the executor fails reading
        store.put(path, b"not a lance file")
    summary = merge_table(loc.uri, dedup=spark_dedup(spark))
    by_region = {r.region_id: r for r in summary.regions}
    assert by_region[good].error is None and by_region[good].generations == [1, 2, 3, 4, 5]
    err = by_region[bad].error
    assert err and "Spark dedup of generations [1, 2, 3, 4, 5] failed" in err and "\n" not in err
    assert store.list(STAGING_DIR) == []


def _run_main(argv, capfd):
    code = merge_job.main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def test_job_usage_errors_are_one_line(tmp_path, capfd):
    code, out, err = _run_main([str(tmp_path), "--up-to-generation", "2"], capfd)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["memwal-merge: error: --up-to-generation 2 needs exactly one --region (got 0)"]
    code, out, err = _run_main([str(tmp_path), "--region", "nope"], capfd)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "not a UUID" in err


def test_job_in_process_up_to_generation_and_a_failed_region(spark, tmp_path, capfd):
    loc = Loc(str(tmp_path / "t"))
    region, other = build_table(loc, n_regions=2)
    code, out, err = _run_main([loc.uri, "--region", region, "--up-to-generation", "2"], capfd)
    assert code == 0, err
    summary = json.loads(out)
    assert out.count("\n") == 1 and summary["regions"][0]["generations"] == [1, 2]
    assert load_index(loc.uri).merged_generations == {region: 2}

    bogus = str(uuid.uuid4())
    code, out, err = _run_main([loc.uri, "--region", region, "--region", bogus], capfd)
    assert (code, out) == (2, ""), "a region the table does not have is bad input: nothing runs"
    assert err.strip().splitlines()[-1] == (f"memwal-merge: error: --region {bogus}: no such region in table "
                                            f"{loc.uri} (2 regions; list them with `memwal status TABLE`)")
    assert load_index(loc.uri).merged_generations == {region: 2}

    store = loc.store()
    for m in store.list(f"_mem_wal/{other}"):
        if "_gen_1/data/" in m.path:  # listed by the manifest: the executor fails reading it
            store.put(m.path, b"not a lance file")
    code, out, err = _run_main([loc.uri, "--region", region, "--region", other], capfd)
    assert code == 3, "a failed region makes the job fail, after printing the summary"
    summary = json.loads(out)
    assert summary["failed_regions"] == [other]
    assert {r["region_id"]: r["generations"] for r in summary["regions"]}[region] == [3, 4, 5]
    assert err.strip().splitlines()[-1].startswith(f"memwal-merge: error: 1 of 2 region(s) failed: {other}: ")
    assert not spark.sparkContext._jsc.sc().isStopped(), "an in-process job must not stop a session it reused"


@pytest.mark.parametrize("task_bytes", [merge_dedup.DEFAULT_TASK_BYTES, 0], ids=["one-task-per-batch", "shuffle"])
def test_one_spark_job_dedups_every_region_batch_of_a_round(spark, tmp_path, task_bytes):
    """Four regions, several per commit: one Spark job for the whole round, same result as in process."""
    a = Loc(str(tmp_path / "a"))
    build_table(a, n_regions=4)
    b = Loc(str(tmp_path / "b"))
    shutil.copytree(a.uri, b.uri)
    before = lsm_view(a)
    config = MergeConfig(max_generations_per_commit=5)  # 5 generations per region: every region in one commit
    local = merge_table(a.uri, config=config)
    hook = spark_dedup(spark, task_bytes=task_bytes)
    on_spark = merge_table(b.uri, config=config, dedup=hook)
    # one commit: the passes in the order the dedup's winners allow, and marker-only steps (memwal.merge_commit)
    assert not on_spark.failed_regions and on_spark.table_commits == local.table_commits == 5, (
        "every tombstone lies above generation 1: upsert pass (step 1), delete pass (2), marker-only 3..5")
    if task_bytes:
        assert hook.stats["jobs"] == 1 and hook.stats["tasks"] >= 2, "one job, region batches in parallel tasks"
        assert hook.stats["inline_batches"] == 4, "small region batches come back in the job's result"
    assert _results(on_spark) == _results(local)
    assert base_rows(b) == base_rows(a) == before
    assert load_index(b.uri).merged_generations == load_index(a.uri).merged_generations
    assert b.store().list(STAGING_DIR) == []
