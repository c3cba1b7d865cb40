"""The catch-up, snapshot and GC entry points: in process on the shared session (merge -> catchup ->
snapshot -> gc on one table), the snapshot's Spark manifest reader against the library's threaded one,
and the snapshot job through real spark-submit."""

from __future__ import annotations

import json

import pytest
from spark_helpers import Loc, base_rows, build_table, lsm_view

from memwal.mem_wal_index import load_index
from memwal.merge import merge_table
from memwal.region_manifest import list_regions
from memwal.snapshot import read_manifests_threaded, read_snapshot
from spark_jobs import catchup as catchup_job
from spark_jobs import gc as gc_job
from spark_jobs import merge as merge_job
from spark_jobs import snapshot as snapshot_job
from spark_jobs import submit
from spark_jobs.merge_dedup import STAGING_DIR

from support.jvm import FAST_JVM
from support.tables import open_base

pytestmark = pytest.mark.spark


def _main(job, argv, capfd) -> dict:
    code = job.main(argv)
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:]
    assert out.count("\n") == 1, out
    return json.loads(out)


def test_spark_manifest_reader_reads_what_the_library_reads(spark, tmp_path):
    loc = Loc(str(tmp_path / "t"))
    build_table(loc, n_regions=3)
    store = loc.store()
    ids = list_regions(store)
    on_spark = snapshot_job.spark_manifest_reader(spark, max_tasks=2)(store, ids)
    assert on_spark == read_manifests_threaded(store, ids)
    assert [m.raw for m in on_spark] == [m.raw for m in read_manifests_threaded(store, ids)]


def test_merge_catchup_snapshot_gc_in_process(spark, tmp_path, capfd):
    loc = Loc(str(tmp_path / "t"))
    regions = build_table(loc)
    before = lsm_view(loc)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")

    merged = _main(merge_job, [loc.uri], capfd)
    assert merged["generations_merged"] == 10 and base_rows(loc) == before

    caught_up = _main(catchup_job, [loc.uri], capfd)
    assert caught_up["job"] == "catchup" and caught_up["failed_indexes"] == []
    assert load_index(loc.uri).details.index_catchup["name_idx"] == dict.fromkeys(regions, 5)

    snap = _main(snapshot_job, [loc.uri, "--inline-threshold", "1"], capfd)
    assert snap["job"] == "snapshot" and snap["num_regions"] == 2 and snap["storage"] == "external"
    assert sorted(read_snapshot(loc.uri).column("current_generation").to_pylist()) == [6, 6]

    store = loc.store()
    store.put(f"{STAGING_DIR}/merge-abandoned/part-0.arrow", b"left by a crashed merge")
    # Older table versions (time travel) still need the generations: only the staging is garbage.
    dry = _main(gc_job, [loc.uri, "--dry-run", "--grace-period-s", "0"], capfd)
    assert dry["dry_run"] and dry["would_delete"] == {"staging": 1} and store.list(STAGING_DIR)
    done = _main(gc_job, [loc.uri, "--grace-period-s", "0"], capfd)
    assert done["deleted"] == {"staging": 1} and done["failed_regions"] == []
    assert store.list(STAGING_DIR) == [], "gc removes abandoned merge staging"
    assert base_rows(loc) == before


def test_snapshot_through_spark_submit(tmp_path):
    """The executors run a manifest reader defined in the job script itself (__main__ under spark-submit)."""
    loc = Loc(str(tmp_path / "t"))
    build_table(loc)
    merge_table(loc.uri)
    summary = submit.run_spark_job("snapshot", loc.uri, master="local[1]", conf=FAST_JVM)
    assert summary["job"] == "snapshot" and summary["num_regions"] == 2
    assert sorted(read_snapshot(loc.uri).column("current_generation").to_pylist()) == [6, 6]
