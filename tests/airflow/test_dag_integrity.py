"""DAG integrity: every DAG file under dags/ imports through Airflow's DagBag with no import error and no
warning, without touching the tables (their storage and connections do not exist here, so any I/O at parse
time is an import error; a stall is one too, through Airflow's own dagbag_import_timeout); the Params
forms accept good values and refuse bad ones; a bad table entry is one import error naming the table and
the key while the other tables' DAGs still load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from airflow_support import REPO, tables_file

PROBE = Path(__file__).resolve().with_name("dag_probe.py")
REGION = "8b19c123-b7b0-4108-9e62-5eacb1d7087c"
UNREACHABLE = {"uri": "s3://nowhere/t", "conn_id": "no_such_connection", "engine": "spark",
               "spark_conn_id": "no_such_spark"}


def probe(env: dict[str, str], confs: list | None = None, **extra_env: str) -> dict:
    proc = subprocess.run([sys.executable, str(PROBE), json.dumps(confs or [])], env={**env, **extra_env},
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"probe failed (exit {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def parsed(airflow_home, tmp_path_factory) -> dict:
    """dags/ parsed with two tables whose storage, connections and Spark master do not exist."""
    path = tables_file(tmp_path_factory.mktemp("tables") / "tables.yaml",
                       {"orders": UNREACHABLE, "clicks": {**UNREACHABLE, "schedule": None}})
    confs = [
        ["memwal_merge", {"table": "orders"}],
        ["memwal_merge", {"table": "clicks", "regions": [REGION], "up_to_generation": 7, "engine": "in_process",
                          "dry_run": True}],
        ["memwal_merge", {"table": "s3://bucket/other"}],
        ["memwal_merge", {"table": "orders", "regions": ["not-a-uuid"]}],
        ["memwal_merge", {"table": "orders", "up_to_generation": 0}],
        ["memwal_merge", {"table": "orders", "engine": "flink"}],
        ["memwal_backfill", {"table": "orders", "max_generations_per_application": 4,
                             "max_bytes_per_application": "512MiB", "rebuild_indexes": True}],
        ["memwal_backfill", {"table": "orders", "max_bytes_per_application": "12 parsecs"}],
        ["memwal_backfill", {"table": "orders", "max_generations_per_application": -1}],
    ]
    return probe(airflow_home, confs, MEMWAL_TABLES_FILE=str(path))


def test_every_dag_file_imports_without_errors_or_warnings(parsed):
    assert parsed["import_errors"] == {}
    assert parsed["captured_warnings"] == {} and parsed["python_warnings"] == []
    files = {p.name for p in (REPO / "dags").glob("*.py")}
    assert files <= set(parsed["parse_s"]), "every DAG file was parsed"


def test_one_maintenance_dag_per_table_with_the_expected_wiring(parsed):
    dags = parsed["dags"]
    assert {"memwal_maintenance__orders", "memwal_maintenance__clicks", "memwal_merge", "memwal_backfill"} <= set(dags)
    m = dags["memwal_maintenance__orders"]
    assert m["tasks"] == ["compaction", "find_pending_regions", "gc", "index_catchup", "merge", "retention",
                          "snapshot_refresh"]
    assert m["max_active_runs"] == 1 and "memwal_spark" in m["pools"]
    assert m["timetable"] == "AssetOrTimeSchedule", "on its clock and on its lag asset"
    assert dags["memwal_maintenance__clicks"]["timetable"] == "AssetTriggeredTimetable", "no clock: the lag asset"
    assert dags["memwal_backfill"]["max_active_runs"] == 1


def test_params_accept_good_values_and_refuse_bad_ones(parsed):
    results = [(c["dag"], c["conf"], c["ok"], c.get("error", "")) for c in parsed["params"]]
    ok = {json.dumps(conf): good for _, conf, good, _ in results}
    errors = {json.dumps(conf): err for _, conf, _, err in results}
    assert ok[json.dumps({"table": "orders"})]
    assert ok[json.dumps({"table": "clicks", "regions": [REGION], "up_to_generation": 7, "engine": "in_process",
                          "dry_run": True})]
    assert ok[json.dumps({"table": "orders", "max_generations_per_application": 4,
                          "max_bytes_per_application": "512MiB", "rebuild_indexes": True})]
    for bad, param in [({"table": "s3://bucket/other"}, "table"), ({"table": "orders", "regions": ["not-a-uuid"]},
                       "regions"), ({"table": "orders", "up_to_generation": 0}, "up_to_generation"),
                       ({"table": "orders", "engine": "flink"}, "engine"),
                       ({"table": "orders", "max_bytes_per_application": "12 parsecs"}, "max_bytes_per_application"),
                       ({"table": "orders", "max_generations_per_application": -1},
                        "max_generations_per_application")]:
        assert not ok[json.dumps(bad)], f"{bad} must be refused"
        assert f"param {param}" in errors[json.dumps(bad)], errors[json.dumps(bad)]


def test_a_bad_table_entry_is_one_import_error_naming_table_and_key_and_the_others_load(airflow_home, tmp_path):
    path = tables_file(tmp_path / "tables.yaml", {
        "good": UNREACHABLE,
        "broken": {**UNREACHABLE, "max_generations_per_commit": "many"},
    })
    parsed = probe(airflow_home, MEMWAL_TABLES_FILE=str(path))
    assert "memwal_maintenance__good" in parsed["dags"] and "memwal_merge" in parsed["dags"]
    assert "memwal_maintenance__broken" not in parsed["dags"]
    (where, error), = parsed["import_errors"].items()
    assert where.endswith("memwal_maintenance.py")
    assert "table 'broken'" in error and "key 'max_generations_per_commit'" in error and "many" in error, error
    assert len(error.splitlines()) == 1, "one line"


LOAD_LAG_MONITOR = """
import runpy, sys
dag = runpy.run_path(sys.argv[1])["memwal_lag_monitor"]()
print(sorted(dag.task_dict), dag.default_args["retries"])
"""


def test_the_lag_monitor_is_one_task_per_cycle_without_retries(airflow_home):
    """One task checks every table (not one mapped task per table); it is not retried (a retry would check
    every table again: the next cycle checks the failed one)."""
    proc = subprocess.run([sys.executable, "-c", LOAD_LAG_MONITOR, str(REPO / "dags" / "memwal_lag_monitor.py")],
                          env=airflow_home, capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == "['check_tables'] 0", proc.stdout
