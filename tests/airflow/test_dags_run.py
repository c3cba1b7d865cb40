"""`dag.test()` of memwal_maintenance__<table>, memwal_merge (and its dry run) and memwal_backfill on SQLite,
over tables written by Lance core's writer: the base table equals Lance core's LSM view afterwards,
merged_generations reach every flushed generation, and the XCom summaries say what was merged."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from airflow_support import (
    add_generations,
    base_rows,
    lance_core_table,
    lsm_view,
    merged_generations,
    run_dag,
    run_dags,
    tables_file,
    task_states,
    xcom,
)

from support.jvm import FAST_JVM
from support.lancedb_peer import INDEX, LanceDbTable, round_batches
from support.tables import open_base

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_support import SparkSubmitRecorder  # the e2e tests' recording spark-submit

SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[2]"})


def _table_env(tmp_path, location, **settings) -> dict[str, str]:
    entry = {"uri": location.uri, "engine": "in_process", "schedule": "@daily", **settings}
    return {"MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {"t1": entry})),
            "AIRFLOW_CONN_SPARK_LOCAL2": SPARK_LOCAL}


def test_maintenance_dag_merges_every_region_in_bounded_batches_then_catchup_snapshot_gc(
        airflow_home, local_location, tmp_path):
    """3 regions x 3 Lance-core generations; max_merge_applications 2: the merge is mapped over 2 region
    batches (never one per region), then catch-up, snapshot refresh and GC run; the base table equals
    Lance core's LSM view and merged_generations reach the last flushed generation of every region."""
    loc = local_location
    regions = lance_core_table(loc, regions=3, generations=3)
    expected = lsm_view(loc)
    env = _table_env(tmp_path, loc, max_merge_applications=2, max_generations_per_commit=2,
                     retention={"older_than_s": 0, "keep_versions": 1})

    report, again = run_dags(airflow_home, [("memwal_maintenance__t1", None)] * 2, extra_env=env)

    assert report["state"] == "success", report["log"][-4000:]
    states = task_states(report)
    merges = [k for k in states if k[0] == "merge"]
    assert len(merges) == 2, f"3 regions in 2 batches (bounded applications per run), got {merges}"
    assert all(states[k] == "success" for k in states), states
    summaries = xcom(report, "merge")
    got = base_rows(loc)
    assert got == expected, (
        "merged base table must equal Lance core's LSM view: "
        + json.dumps({"base_only": [r for r in got if r not in expected][:20],
                      "lsm_only": [r for r in expected if r not in got][:20],
                      "lsm_now_equals_before": lsm_view(loc) == expected,
                      "merges": [[(r["region_id"], r["generations"], r["commits"]) for r in s["regions"]]
                                 for s in summaries],
                      "versions": [(v["version"], str(v.get("metadata"))) for v in open_base(loc).versions()]},
                     default=str))
    assert merged_generations(loc) == dict.fromkeys(regions, 3), "every region merged up to generation 3"
    merged = {r["region_id"]: r["generations"] for s in summaries for r in s["regions"]}
    assert merged == {r: [1, 2, 3] for r in regions}, "each region merged once, generations ascending"
    assert all(s["commits"] >= 2 for s in summaries), "max_generations_per_commit 2 splits 3 generations"
    assert xcom(report, "index_catchup")[0]["job"] == "catchup"
    assert xcom(report, "snapshot_refresh")[0]["num_regions"] == 3
    assert xcom(report, "compaction")[0]["job"] == "compaction"
    retained = xcom(report, "retention")[0]
    assert retained["job"] == "retention" and retained["num_versions_removed"] > 0
    assert xcom(report, "gc")[0]["deleted"].get("generation") == 9, (
        "retention in the same run lets GC free every merged generation: no demo-only helper")
    events = report["asset_events"]
    assert {e["asset"] for e in events} == {"memwal__t1"}
    assert sorted(r for e in events for r in e["extra"]["regions"]) == sorted(regions), \
        "the table asset's events carry the generations merged per region"
    assert sum(e["extra"]["rows_upserted"] for e in events) == sum(s["rows_upserted"] for s in summaries)

    # The second run found nothing pending: the merge mapped over zero batches, the rest still ran.
    assert again["state"] == "success", again["log"][-3000:]
    assert task_states(again)[("merge", -1)] == "skipped"
    assert task_states(again)[("gc", -1)] == "success"
    assert not again["asset_events"], "no merge, no table-merged event"
    assert base_rows(loc) == expected


@pytest.mark.spark
@pytest.mark.s3
def test_memwal_merge_on_spark_via_spark_submit_hook_on_s3_keeps_the_secret_out(airflow_home, s3_location, tmp_path):
    """engine spark (the form overrides the table's in_process): the Spark provider's SparkSubmitHook submits
    spark_jobs/merge.py with the table's Spark connection (local[2]); the storage options come from a
    `memwal` connection whose secret is a canary, passed as --storage-options-json @FILE. The merge is
    right, the job's own summary is the XCom, the canary reached the job (its hash, recorded by a wrapping
    spark-submit from the options file) and is in no log line, XCom, asset event or argv, and the options
    file is gone."""
    loc = s3_location
    regions = lance_core_table(loc, regions=2, generations=2)
    expected = lsm_view(loc)
    canary = f"canary-{uuid.uuid4().hex}"
    opts = loc.storage_options
    conn = {"conn_type": "memwal", "host": opts["aws_endpoint"], "login": opts["aws_access_key_id"],
            "password": canary, "extra": {"region": opts["aws_region"], "allow_http": True}}
    env = _table_env(tmp_path, loc, conn_id="s3_canary", spark_conn_id="spark_local2", spark_conf=FAST_JVM)
    env["AIRFLOW_CONN_S3_CANARY"] = json.dumps(conn)
    env["TMPDIR"] = str(tmp_path)
    # spark-submit through a recording wrapper: it records the SHA-256 of the secret in the options file the
    # job was given (the positive control: the canary reached the job, so its absence elsewhere means something)
    recorder = SparkSubmitRecorder(tmp_path / "recorder").install()
    env["SPARK_HOME"] = recorder.spark_home
    env["PATH"] = f"{recorder.bin}{os.pathsep}{airflow_home.get('PATH', '')}"

    report = run_dag(airflow_home, "memwal_merge", {"table": "t1", "engine": "spark"}, extra_env=env)

    assert report["state"] == "success", report["log"][-5000:]
    (summary,) = xcom(report, "merge")
    assert summary["spark_master"] == "local[2]" and summary["spark_application_id"], summary
    assert summary["generations_merged"] == 4
    assert "Spark-Submit cmd" in report["log"] and "--storage-options-json @" in report["log"], \
        "the Spark provider's hook ran spark-submit with the options in a file"
    assert base_rows(loc) == expected
    assert merged_generations(loc) == {r: 2 for r in regions}
    public = json.dumps({k: v for k, v in report.items() if k != "log"}) + report["log"]
    assert [r["secret_sha256"] for r in recorder.records()] == [hashlib.sha256(canary.encode()).hexdigest()], \
        "control: the connection's secret (the canary) reached the Spark job, in its storage options file"
    assert canary not in public, "the connection's secret must not reach logs, XCom or asset events"
    assert not [a for r in recorder.records() for a in r["argv"] if canary in a], "nor the spark-submit argv"
    assert not list(tmp_path.glob("memwal-merge-*")), "the storage options file is deleted after the job"


def test_memwal_merge_dry_run_plans_only_then_merge_one_region_up_to_a_generation(
        airflow_home, local_location, tmp_path):
    """memwal_merge: a dry run returns the plan (generations, rows, bytes per region) and changes nothing;
    then region A up to generation 2 merges exactly generations 1..2 of A and nothing of B."""
    loc = local_location
    a, b = lance_core_table(loc, regions=2, generations=3)
    env = _table_env(tmp_path, loc)
    version = open_base(loc).version

    dry, run = run_dags(airflow_home, [("memwal_merge", {"table": "t1", "dry_run": True}),
                                       ("memwal_merge", {"table": "t1", "regions": [a], "up_to_generation": 2})],
                        extra_env=env)

    assert dry["state"] == "success", dry["log"][-3000:]
    assert task_states(dry)[("merge", -1)] == "skipped"
    plan = {p["region_id"]: p for p in xcom(dry, "plan", "plan")[0]}
    assert set(plan) == {a, b}
    assert plan[a]["generations"] == [1, 2, 3] and plan[a]["rows"] == 24 and plan[a]["bytes"] > 0
    assert not dry["asset_events"]
    assert run["state"] == "success", run["log"][-3000:]
    (summary,) = xcom(run, "merge")
    assert summary["table_version_before"] == version, "the dry run changed nothing"
    assert [(r["region_id"], r["generations"], r["merged_generation_before"]) for r in summary["regions"]] == \
        [(a, [1, 2], 0)]
    assert merged_generations(loc).get(a) == 2 and merged_generations(loc).get(b, 0) == 0
    (event,) = run["asset_events"]
    assert event["asset"] == "memwal__t1" and event["extra"]["regions"][a]["generations"] == [1, 2]


def test_memwal_backfill_drains_in_bounded_chunks_resumes_and_is_safe_twice(airflow_home, local_location, tmp_path):
    """A backlog of 5 generations in one region and 2 in another, at most 2 generations per application:
    chunks A:1-2, A:3-4, A:5, B:1-2 as mapped tasks; then catch-up (rebuilt indexes) and snapshot. More
    generations arrive; a rerun merges only those (resumes from merged_generations)."""
    loc = local_location
    a, b = lance_core_table(loc, regions=2, generations=2)
    add_generations(loc, a, 3, start=5000)
    expected = lsm_view(loc)
    env = _table_env(tmp_path, loc)
    conf = {"table": "t1", "max_generations_per_application": 2, "max_bytes_per_application": None,
            "rebuild_indexes": True}

    report = run_dag(airflow_home, "memwal_backfill", conf, extra_env=env)

    assert report["state"] == "success", report["log"][-4000:]
    chunks = xcom(report, "merge_chunk")
    per_chunk = [[(r["region_id"], r["generations"]) for r in c["regions"]] for c in chunks]
    assert sorted(per_chunk) == sorted([[(a, [1, 2])], [(a, [3, 4])], [(a, [5])], [(b, [1, 2])]]), per_chunk
    labels = {t["rendered_map_index"] for t in report["tasks"] if t["task_id"] == "merge_chunk"}
    assert f"region {a}: generations 3..4" in labels, labels
    assert base_rows(loc) == expected
    assert merged_generations(loc) == {a: 5, b: 2}
    catchup = xcom(report, "index_catchup")[0]
    assert [i["index_name"] for i in catchup["indexes"]] == ["name_idx"] and not catchup["failed_indexes"]

    add_generations(loc, b, 1, start=7000)
    expected = lsm_view(loc)
    again = run_dag(airflow_home, "memwal_backfill", {**conf, "rebuild_indexes": False}, extra_env=env)
    assert again["state"] == "success", again["log"][-3000:]
    assert [[(r["region_id"], r["generations"]) for r in c["regions"]] for c in xcom(again, "merge_chunk")] == \
        [[(b, [3])]], "a rerun resumes from merged_generations"
    assert base_rows(loc) == expected and merged_generations(loc) == {a: 5, b: 3}


def test_maintenance_dag_on_a_lancedb_table_and_lancedb_writes_on(airflow_home, local_location, tmp_path):
    """A table LanceDB 0.40 made (key marked by position only, bucket spec, a maintained BTREE index) and
    wrote through its LSM path for two rounds (keys repeated inside generations): one run of
    memwal_maintenance__<table> merges every generation, catches the index up, refreshes the snapshot and
    runs GC; LanceDB's query() and count_rows() then equal the model, and LanceDB writes on."""
    t = LanceDbTable(local_location)
    t.create("bucket", maintained_index=True)
    for r in range(2):
        t.write_round(round_batches(r))
    env = {"MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {
        "ldb": {"uri": t.table.uri, "engine": "in_process", "schedule": "@daily"}}))}

    [report] = run_dags(airflow_home, [("memwal_maintenance__ldb", None)], extra_env=env)

    assert report["state"] == "success", report["log"][-4000:]
    assert all(s == "success" for s in task_states(report).values()), task_states(report)
    assert t.base_rows() == t.expected(), "the merged base table equals the model"
    assert merged_generations(t.table) == t.flushed_max(), "every LanceDB generation merged"
    [catchup] = xcom(report, "index_catchup")
    assert [i["index_name"] for i in catchup["indexes"] if i["covered"]] == [INDEX], catchup
    assert t.query() == t.expected() and t.count_rows() == len(t.model)
    t.write_round(round_batches(2))
    assert t.query() == t.expected(), "LanceDB writes on to the table the DAG maintained"
