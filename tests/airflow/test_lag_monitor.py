"""memwal_lag_monitor under `dag.test()` (runs in a child process, SQLite metadata DB): it alerts through the
webhook and the table's other notifier (both from its `alerts` entry in the tables file) once when the
table crosses a threshold, not again while it stays behind, once when it is back under, and its history
and alert state are readable outside any task."""

from __future__ import annotations

import json

import pytest
from airflow_support import lance_core_table, tables_file
from lag_support import WebhookReceiver, lag_run


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


def test_alerts_once_on_crossing_and_once_when_resolved(airflow_home, local_location, tmp_path, receiver):
    loc = local_location
    (region,) = lance_core_table(loc, regions=1, generations=3)
    table = "lagmon_orders"
    notes = tmp_path / "file_notifier.txt"  # the table's second notifier, configured by dotted path
    env = {
        **airflow_home,
        "MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {table: {
            "uri": loc.uri, "engine": "in_process", "schedule": None,
            "thresholds": {"max_unmerged_generations": 2},
            "alerts": {"webhook_conn_id": "lagmon_hook", "notifiers": [
                {"class": "lag_support.FileNotifier", "kwargs": {"path": str(notes)}}]}}})),
        "AIRFLOW_CONN_LAGMON_HOOK": json.dumps({"conn_type": "http", "host": receiver.url()}),
    }

    # three runs in one Airflow process: behind, still behind, merged (then back within)
    runs = lag_run(env, "monitor", json.dumps({"uri": loc.uri, "runs": ["run", "run", "merge"]}))["runs"]
    for run in runs:
        assert run["state"] == "success" and run["tasks"] == {"check_tables[-1]": "success"}, run
    first, second, third = (run["results"][0] for run in runs)

    assert first["alerts"] == {table: "firing"} and runs[0]["rows"][table]["unmerged_generations"] == 3
    assert second["alerts"] == {}, "still behind: no second alert"
    assert third["alerts"] == {table: "resolved"} and runs[2]["rows"][table]["unmerged_generations"] == 0
    assert runs[0]["rows"][table]["probe"]["due"][0]["job"] == "merge", "the page's row has the probe's answer"
    assert runs[2]["rows"][table]["probe"]["due"] == [] or "merge" not in runs[2]["rows"][table]["probe"]["due"]
    assert [p["text"].split()[0] for p in receiver.posts] == ["[FIRING]", "[RESOLVED]"], "one alert each way"
    assert receiver.posts[0]["memwal"]["breaches"][0]["region_id"] == region
    assert "s3cr3t" not in json.dumps(runs), "the webhook URL is not in XCom"
    assert notes.read_text().splitlines() == ["firing lagmon_orders", "resolved lagmon_orders"], (
        "the table's other notifier got the same two alerts")

    outside = lag_run(env, "read", table)  # another process, outside any task: what the UI page reads
    assert [s["unmerged_generations"] for s in outside["history"]] == [3, 3, 0]
    assert outside["history"][0]["regions"][region]["unmerged_generations"] == 3
    assert outside["alert_state"]["alerted"] == [] and outside["alert_state"]["last_alert"] == "resolved"


def test_a_bad_tables_file_entry_fails_the_cycle_without_retry_and_the_others_are_checked(
        airflow_home, local_location, tmp_path):
    """A bad entry is a config error, not a transient one: the one task checks the good table, reports the
    bad one (its row names the table and key) and then fails once, without a retry."""
    lance_core_table(local_location, regions=1, generations=1)
    env = {**airflow_home,
           "MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {
               "good": {"uri": local_location.uri, "engine": "in_process", "schedule": None},
               "broken": {"uri": local_location.uri, "thresholds": {"max_unmerged_generations": -1}}}))}
    (run,) = lag_run(env, "monitor", json.dumps({"uri": local_location.uri, "runs": ["run"]}))["runs"]
    assert run["tasks"] == {"check_tables[-1]": "failed"} and run["tries"]["check_tables[-1]"] == 1, run
    assert "max_unmerged_generations" in run["rows"]["broken"]["error"], run["rows"]["broken"]
    assert run["rows"]["good"]["error"] is None and run["rows"]["good"]["unmerged_generations"] == 1, run


def test_an_unreadable_tables_file_fails_the_monitor_without_retry(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from memwal.airflow.monitor import check_configured_table, configured_tables

    path = tmp_path / "tables.yaml"
    path.write_text("tables: {a: [\n")
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    with pytest.raises(AirflowFailException, match="not valid YAML"):
        configured_tables()
    tables_file(path, {"t": {"uri": "/t", "engine": "sparky"}})
    assert configured_tables() == ["t"]
    with pytest.raises(AirflowFailException, match="table 't', key 'engine'"):
        check_configured_table("t")


def test_a_table_that_cannot_be_read_is_one_breach_naming_it(tmp_path):
    """No table at the URI: the monitor still records and alerts (table:unreachable) with one clear line."""
    from types import SimpleNamespace

    from memwal.airflow.monitor import _measure

    cfg = SimpleNamespace(name="gone", uri=str(tmp_path / "missing.lance"), conn_id=None, thresholds=None)
    summary, found, error = _measure(cfg)
    assert error and "does not exist" in error and "missing.lance" in error and "\n" not in error
    assert [b["key"] for b in found] == ["table:unreachable"] and summary["regions"] == []


def test_health_thresholds_breach_in_the_monitor_like_lag_ones(local_location):
    """The monitor measures health too: a table with more versions than `max_table_versions` is a table
    breach (the same alerting path as lag); within every limit, nothing."""
    from types import SimpleNamespace

    from memwal.airflow.config import Thresholds
    from memwal.airflow.monitor import _measure

    loc = local_location
    lance_core_table(loc, regions=1, generations=1)
    cfg = SimpleNamespace(name="t", uri=loc.uri, conn_id=None,
                          thresholds=Thresholds(max_table_versions=1, max_fragments=100, max_deleted_ratio=0.5))
    summary, found, error = _measure(cfg)
    assert error is None and summary["health"]["table_versions"] > 1
    assert [b["key"] for b in found] == ["table:table_versions"], found
    cfg.thresholds = Thresholds(max_table_versions=100)
    assert _measure(cfg)[1] == []
