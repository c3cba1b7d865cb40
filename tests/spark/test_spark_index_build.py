"""Catch-up's index segments built on Spark executors (`spark_jobs.catchup.distributed_build`): every type
the build takes gets segments over fragment groups from Spark tasks, searches equal brute force and equal
what the in-process runner built on an identical table, Lance reports no unindexed rows; the entry point
reports where each index was built and why."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memwal import index_build
from memwal.catchup import DistributedBuild, catchup_table
from memwal.index_segments import segment_counts
from memwal.table import MemWalTable
from memwal.task_runner import in_process
from spark_jobs import catchup as catchup_job

from support.index_tables import append, create_index_table, search_results

pytestmark = pytest.mark.spark

BASE, NEW = 2000, 3000


def test_segments_built_on_spark_equal_the_in_process_build(spark, local_location):
    built = {}
    for engine in ("in_process", "spark"):
        loc = local_location.child(engine)
        create_index_table(loc, BASE)
        append(loc, BASE, BASE + NEW)
        if engine == "spark":
            build = catchup_job.distributed_build(spark, min_rows=0, min_group_rows=500)
            assert build.groups == 2 and build.threads == 1, "local[2]: two one-core task slots"
        else:
            build = DistributedBuild(in_process, groups=2, where="in_process_tasks", min_rows=0, min_group_rows=500)
        summary = catchup_table(loc.uri, distributed=build)
        assert all(r.error is None and r.covered and r.segments_built == 2 for r in summary.indexes), summary
        assert {r.where for r in summary.indexes} == {build.where}
        ds = MemWalTable(loc.uri).refresh().dataset
        assert set(segment_counts(ds).values()) == {3}
        built[engine] = search_results(ds)
    assert built["spark"] == built["in_process"]


def test_entry_point_reports_where_and_why(spark, local_location, capfd, monkeypatch):
    loc = local_location
    create_index_table(loc, BASE, None)
    append(loc, BASE, BASE + 1000)
    assert catchup_job.main([loc.uri]) == 0
    out = json.loads(capfd.readouterr().out)
    assert {i["where"] for i in out["indexes"]} == {"in_process"}, "1000 rows: under the measured threshold"
    assert all("under the distributed threshold" in i["why"] for i in out["indexes"])
    monkeypatch.setitem(index_build.DISTRIBUTED_MIN_ROWS, "vector", 0)
    monkeypatch.setitem(index_build.DISTRIBUTED_MIN_ROWS, "scalar", 0)
    monkeypatch.setattr("memwal.index_build.MIN_GROUP_ROWS", 250)
    append(loc, BASE + 1000, BASE + 2000)
    assert catchup_job.main([loc.uri]) == 0
    out = json.loads(capfd.readouterr().out)
    assert {i["where"] for i in out["indexes"]} == {"spark"}, out
    assert all(i["segments_built"] == 2 and i["covered"] for i in out["indexes"]), out
    search_results(MemWalTable(loc.uri).refresh().dataset)


def test_the_threshold_can_be_set_on_the_session(spark):
    assert catchup_job.distributed_build(spark).min_rows is None, "by kind"
    spark.conf.set(catchup_job.MIN_ROWS_CONF, "5000")
    try:
        assert catchup_job.distributed_build(spark).min_rows == 5000
    finally:
        spark.conf.unset(catchup_job.MIN_ROWS_CONF)


def test_a_task_failing_on_an_executor_leaves_the_index_as_it_was(spark, local_location, monkeypatch):
    """One group's task fails on its executor (Lance refuses a fragment that is not in the table): the Spark
    job fails, nothing is committed or recorded, the other task's segment is unreferenced, and the next
    catch-up builds the index."""
    loc = local_location
    create_index_table(loc, BASE, {"id_idx": ("id", "BTREE", {})})
    append(loc, BASE, BASE + NEW)
    plan_build = index_build.plan_build

    def with_a_bad_group(*args, **kwargs):
        plan = plan_build(*args, **kwargs)
        plan.tasks[-1] = dataclasses.replace(plan.tasks[-1], fragment_ids=(999,))
        return plan

    monkeypatch.setattr(index_build, "plan_build", with_a_bad_group)
    before = MemWalTable(loc.uri).refresh().dataset
    build = catchup_job.distributed_build(spark, min_rows=0, min_group_rows=500)
    (result,) = catchup_table(loc.uri, distributed=build).indexes
    assert result.error and "building segments of index id_idx (spark) failed" in result.error, result
    assert not result.covered and result.segments_built == 0
    ds = MemWalTable(loc.uri).refresh().dataset
    assert ds.version == before.version and segment_counts(ds) == segment_counts(before)
    assert ds.count_rows() == BASE + NEW
    monkeypatch.setattr(index_build, "plan_build", plan_build)
    (result,) = catchup_table(loc.uri, distributed=build).indexes
    assert result.covered and result.segments_built == 2
    search_results(MemWalTable(loc.uri).refresh().dataset, ("id_idx",))


def test_a_maintained_index_dropped_from_the_base_does_not_stop_catch_up_on_spark(spark, local_location, capfd,
                                                                                   monkeypatch):
    """Issue 40 item 4: maintained ["sidx", "tidx"] (BTREE, IVF_PQ), a merged generation, sidx dropped from
    the base, catch-up on Spark past its threshold (lowered on the session). It exited 1 with StopIteration
    and tidx stayed caught up to 0, freezing GC; now sidx is skipped (a warning, `skipped_indexes`), tidx's
    segments are built on the executors and it is caught up to the merged generation, which GC may remove."""
    import uuid

    import lance

    from memwal.gc import safe_generation
    from memwal.index_coverage import with_coverage
    from memwal.merge import merge_table
    from memwal.writer import RegionWriter

    from support.index_tables import rows
    from support.maintenance import ONE_GEN_PER_FLUSH

    loc = local_location
    ds = lance.write_dataset(rows(0, BASE), loc.uri, max_rows_per_file=BASE // 2)
    ds.create_scalar_index("text", "BTREE", name="sidx")
    ds.create_index("vec", "IVF_PQ", name="tidx", num_partitions=4, num_sub_vectors=4)
    lance.dataset(loc.uri).initialize_mem_wal(unsharded=True, maintained_indexes=["sidx", "tidx"])
    region = str(uuid.uuid4())
    with RegionWriter(loc.uri, region, config=ONE_GEN_PER_FLUSH) as w:
        w.put(rows(BASE, BASE + 1000))
        w.flush()
    merge_table(loc.uri)
    lance.dataset(loc.uri).drop_index("sidx")
    monkeypatch.setattr("memwal.index_build.MIN_GROUP_ROWS", 250)
    spark.conf.set(catchup_job.MIN_ROWS_CONF, "0")
    try:
        code = catchup_job.main([loc.uri])
    finally:
        spark.conf.unset(catchup_job.MIN_ROWS_CONF)
    captured = capfd.readouterr()
    assert code == 0, captured.err[-2000:]
    out = json.loads(captured.out)
    assert out["skipped_indexes"] == ["sidx"] and out["failed_indexes"] == [] and out["uncovered_indexes"] == []
    assert f"{loc.uri}: maintained index sidx is not on the base table" in captured.err
    [tidx] = [i for i in out["indexes"] if i["index_name"] == "tidx"]
    assert tidx["where"] == "spark" and tidx["segments_built"] >= 1 and tidx["covered"], tidx
    assert tidx["caught_up_generations"] == {region: 1}
    table = MemWalTable(loc.uri)
    assert table.details.index_catchup == {"tidx": {region: 1}}
    index = with_coverage(table.index, table.dataset, table.maintained_indexes())
    assert safe_generation(index, region, table.maintained_indexes(), {}) == (1, "merged_generations")
