"""MemWalHook.run_batch: a batch of tables' due jobs in one application, one result per table. In process on
real tables; on `spark` through the Spark provider's SparkSubmitHook, checked with a recording stand-in of
spark-submit (no Spark starts: tests/spark/test_fleet_spark.py runs the real one): one submit of
spark_jobs/fleet.py, the connection's secret in a private file only, the tables' results read back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from memwal.airflow.hooks.memwal import MemWalHook, MemWalTaskError
from memwal.fleet_batch import TableDue, from_probe
from memwal.probe import probe_table

from support.maintenance import build_table
from support.tables import open_base

CANARY = "canary-batch-5ecret"

# Records its argv, the batch and options files it was handed; writes the result file as fleet.py would.
FAKE_SPARK_SUBMIT = """#!{python}
import json, os, sys
argv = sys.argv[1:]
script = next(i for i, a in enumerate(argv) if a.endswith("spark_jobs/fleet.py"))
batch = json.load(open(argv[script + 1]))
ref = argv[script + 3] if argv[script + 2:script + 3] == ["--storage-options-json"] else None
with open({record!r}, "a") as f:
    f.write(json.dumps({{"argv": argv, "options": ref and json.load(open(ref[1:])), "batch": batch}}) + "\\n")
tables = [{{"table_uri": t["uri"], "status": "ok", "ran": [j["job"] for j in t["jobs"]]}} for t in batch["tables"]]
summary = {{"job": "fleet", "tables": tables, "failed_tables": []}}
json.dump({{"exit": {exit}, "summary": summary if {exit} in (0, 3) else None, "error": "bad batch file"}},
          open(os.environ["MEMWAL_RESULT_FILE"], "w"))
"""


def test_in_process_batch_isolates_a_missing_table(tmp_path):
    from support.locations import Location

    locs = [Location("local", str(tmp_path / f"t{i}"), None) for i in range(2)]
    for loc in locs:
        build_table(loc, regions=1, generations=2)
    entries = [from_probe(probe_table(loc.uri)) for loc in locs]
    missing = TableDue(str(tmp_path / "gone"), ("merge",))
    results = MemWalHook(memwal_conn_id=None).run_batch([entries[0], missing, entries[1]], engine="in_process")
    assert [r["status"] for r in results] == ["ok", "failed", "ok"]
    assert "does not exist" in results[1]["error"] and results[1]["failed_job"] == "merge"
    assert all(open_base(loc).count_rows() > 10 for loc in locs), "the merges landed"


def _fake_spark(tmp_path, monkeypatch, exit_code: int = 0) -> Path:
    home = tmp_path / "spark-home"
    (home / "bin").mkdir(parents=True)
    record = tmp_path / "record.jsonl"
    script = home / "bin" / "spark-submit"
    script.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable, record=str(record), exit=exit_code))
    script.chmod(0o755)
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_FLEET", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_FLEET", json.dumps(
        {"conn_type": "memwal", "host": "http://127.0.0.1:9", "login": "AKIDFLEET", "password": CANARY}))
    return record


def test_spark_batch_is_one_submit_with_the_secret_in_a_file_only(tmp_path, monkeypatch, caplog):
    record = _fake_spark(tmp_path, monkeypatch)
    entries = [TableDue(f"s3://b/t{i}", ("merge", "snapshot")) for i in range(20)]
    caplog.set_level("INFO")
    results = MemWalHook(memwal_conn_id="lake_fleet").run_batch(entries, engine="spark", spark_conn_id="spark_fleet")
    (seen,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["table_uri"] for r in results] == [e.uri for e in entries] and results[0]["ran"] == ["merge", "snapshot"]
    assert seen["argv"][-4].endswith("spark_jobs/fleet.py"), "one application: the fleet entry point"
    assert seen["options"]["aws_secret_access_key"] == CANARY, "control: the secret reached the driver"
    assert CANARY not in json.dumps(seen["argv"]) + json.dumps(seen["batch"]) + caplog.text


def test_a_batch_the_driver_refused_fails_the_task_without_retry(tmp_path, monkeypatch):
    _fake_spark(tmp_path, monkeypatch, exit_code=2)
    with pytest.raises(AirflowFailException, match="bad batch file"):
        MemWalHook(memwal_conn_id=None).run_batch([TableDue("/t/x", ("merge",))], engine="spark",
                                                  spark_conn_id="spark_fleet")


def test_a_bad_engine_is_named_and_an_empty_batch_starts_nothing():
    with pytest.raises(AirflowFailException, match="engine 'auto'"):
        MemWalHook(memwal_conn_id=None).run_batch([TableDue("/t/x", ("gc",))], engine="auto")
    assert MemWalHook(memwal_conn_id=None).run_batch([], engine="spark", spark_conn_id="nowhere") == []
    assert issubclass(MemWalTaskError, Exception)


def test_tables_with_only_driver_only_jobs_due_start_no_spark(tmp_path, monkeypatch):
    from support.locations import Location

    record = _fake_spark(tmp_path, monkeypatch)
    loc = Location("local", str(tmp_path / "t"), None)
    build_table(loc, regions=1, generations=1)
    gc_only = TableDue(loc.uri, ("gc", "retention"))
    hook = MemWalHook(memwal_conn_id=None)
    (alone,) = hook.run_batch([gc_only], engine="spark", spark_conn_id="spark_fleet")
    assert alone["status"] == "ok" and alone["ran"] == ["retention", "gc"]
    assert not record.exists(), "GC and retention are the driver's work: no spark-submit for them"
    mixed = [TableDue("s3://b/t1", ("merge",)), gc_only, TableDue("s3://b/t2", ("snapshot", "gc"))]
    results = hook.run_batch(mixed, engine="spark", spark_conn_id="spark_fleet")
    assert [r["table_uri"] for r in results] == [e.uri for e in mixed], "one result per table, in order"
    (seen,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert [t["uri"] for t in seen["batch"]["tables"]] == ["s3://b/t1", "s3://b/t2"]
