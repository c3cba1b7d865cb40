"""The fleet DAG file (dags/memwal_fleet.py) is cheap for Airflow 3's task runner, which parses it before every
fleet task: it reads no tables file and builds the same two DAGs whatever the fleet, the scheduled one holding
the probe alone (an idle cycle is one task instance)."""

from __future__ import annotations

from test_dag_integrity import probe


def test_the_fleet_dag_file_reads_no_tables_file_and_builds_two_dags(airflow_home, tmp_path):
    parsed = probe(airflow_home, MEMWAL_TABLES_FILE=str(tmp_path / "no_such_tables_file.yaml"),
                   MEMWAL_FLEET_SCHEDULE="*/10 * * * *")
    fleet_errors = {f: e for f, e in parsed["import_errors"].items() if f.endswith("memwal_fleet.py")}
    assert fleet_errors == {}, "the fleet's DAG file does not read the tables file"
    assert any(f.endswith("memwal_maintenance.py") for f in parsed["import_errors"]), \
        "control: the per-table DAG file does read it (and fails without it)"
    fleet = {d: v for d, v in parsed["dags"].items() if v["fileloc"].endswith("memwal_fleet.py")}
    assert {d: v["tasks"] for d, v in fleet.items()} == {
        "memwal_fleet": ["probe"], "memwal_fleet_maintain": ["due_work", "maintain"]}
    assert fleet["memwal_fleet"]["max_active_runs"] == 1
    assert fleet["memwal_fleet"]["timetable"] == "CronTriggerTimetable"
