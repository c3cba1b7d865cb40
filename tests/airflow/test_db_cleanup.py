"""memwal_db_cleanup: `airflow db clean` of the metadata DB, a dry run by default, its retention and tables from
the Variable `memwal_db_cleanup`; a bad setting is named; the blocked DB connection a task carries is not
handed to the command."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from airflow_support import run_dag, task_states, xcom

from memwal.airflow.db_cleanup import BLOCKED_CONN, CleanupSettings, clean_command, command_env, parse_settings


def test_defaults_are_a_dry_run_of_30_days_and_bad_settings_are_named():
    assert parse_settings(None) == CleanupSettings(30.0, True, ())
    assert parse_settings('{"retention_days": 7, "dry_run": false, "tables": ["log"]}') == CleanupSettings(
        7.0, False, ("log",))
    for raw, named in (('{"days": 7}', "unknown key 'days'"), ('{"retention_days": 0}', "retention_days"),
                       ('{"retention_days": "7"}', "retention_days"), ('{"dry_run": "no"}', "dry_run"),
                       ('{"tables": "log"}', "tables"), ('{"tables": ["log; drop"]}', "tables"), ("[1]", "object"),
                       ("{", "not JSON")):
        with pytest.raises(ValueError, match="memwal_db_cleanup") as info:
            parse_settings(raw)
        assert named in str(info.value), (raw, str(info.value))


def test_the_command_cleans_before_now_minus_the_retention_and_is_dry_unless_told():
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    cmd = clean_command(CleanupSettings(7.0), now)
    assert cmd[1:5] == ["db", "clean", "--clean-before-timestamp", "2026-11-20T12:00:00+00:00"]
    assert cmd[-1] == "--dry-run" and "--yes" in cmd and "--tables" not in cmd
    real = clean_command(CleanupSettings(1.5, False, ("log", "xcom")), now)
    assert "--dry-run" not in real and real[real.index("--tables") + 1] == "log,xcom"
    assert "2026-11-26T00:00:00+00:00" in real


def test_the_tasks_blocked_db_connection_is_not_handed_to_the_command():
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": BLOCKED_CONN, "AIRFLOW__CORE__SQL_ALCHEMY_CONN": BLOCKED_CONN,
           "PATH": "/bin"}
    assert command_env(env) == {"PATH": "/bin"}, "the worker's own configuration applies"
    assert command_env(env, "postgresql://db/airflow")["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == (
        "postgresql://db/airflow")
    mine = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite:////x.db"}
    assert command_env(mine) == mine, "a real connection is kept"


def test_the_dag_dry_runs_by_default_and_cleans_when_told(airflow_home):
    report = run_dag(airflow_home, "memwal_db_cleanup")
    assert task_states(report) == {("clean_metadata_db", -1): "success"}, report["log"][-3000:]
    (dry,) = xcom(report, "clean_metadata_db")
    assert dry["dry_run"] is True and dry["tables"] == "all"
    assert any("dag_run" in line for line in dry["output"]), dry["output"]

    report = run_dag(airflow_home, "memwal_db_cleanup", extra_env={"AIRFLOW_VAR_MEMWAL_DB_CLEANUP": json.dumps(
        {"retention_days": 0.00001, "dry_run": False, "tables": ["log"]})})
    assert task_states(report) == {("clean_metadata_db", -1): "success"}, report["log"][-3000:]
    (real,) = xcom(report, "clean_metadata_db")
    assert real["dry_run"] is False and real["tables"] == ["log"]
    assert not any("dag_run" in line for line in real["output"]), "only the table asked for"

