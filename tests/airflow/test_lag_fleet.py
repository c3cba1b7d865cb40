"""The lag monitor's cycle (`memwal.airflow.monitor.check_fleet`): one call checks every configured table, a
table that cannot be read is reported (its row's error, its probe's error, its `table:unreachable` alert)
while the others are checked, and each table's gauges and alerts are exactly those the per-table check
(`check_table_lag`) gives. In process: the lag assets' state stores and the fleet-status Variable are dicts,
the gauges are recorded instead of sent, and the clock of the measurement is fixed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow_support import DictStore, tables_file

from memwal.airflow import fleet_status, history, monitor
from memwal.airflow.config import load_tables
from memwal.airflow.metrics import lag_metrics

from support.maintenance import build_table

NOW = 1_900_000_000.0  # the measurement's clock: ages are the same in both runs


@pytest.fixture
def recorded(monkeypatch):
    """Fresh state stores per table, the fleet-status Variables, and every gauge and alert, per table."""
    import memwal.lag
    import memwal.status

    out: dict = {}

    def reset() -> dict:
        out.update(stores={}, variables=DictStore(), gauges={}, alerts={})
        return out

    reset()
    monkeypatch.setattr(history, "_store", lambda table: out["stores"].setdefault(table, DictStore()))
    monkeypatch.setattr(fleet_status, "_backend", lambda: out["variables"])
    monkeypatch.setattr(monitor, "emit_lag_metrics", lambda table, summary, n: out["gauges"].setdefault(
        table, sorted((name, value) for name, value, _ in lag_metrics(table, summary, n))))
    monkeypatch.setattr(memwal.status, "time", SimpleNamespace(time=lambda: NOW))
    monkeypatch.setattr(memwal.lag, "time", SimpleNamespace(time=lambda: NOW))
    monkeypatch.delenv("MEMWAL_HEALTH_STORAGE_INTERVAL_S", raising=False)
    out["reset"] = reset
    return out


def _notifier(out: dict):
    def notify(context) -> None:
        alert = context["memwal_alert"]
        out["alerts"].setdefault(alert["table"], []).append(
            {k: v for k, v in alert.items() if k not in ("at", "since")})
    return notify


def test_one_cycle_checks_every_table_reports_the_failing_one_and_sends_what_the_per_table_check_sends(
        tmp_path, monkeypatch, recorded):
    for name, regions in (("alpha", 2), ("beta", 1)):
        loc = SimpleNamespace(kind="local", uri=str(tmp_path / f"{name}.lance"), storage_options=None)
        build_table(loc, regions=regions, generations=2)
    entries = {name: {"uri": str(tmp_path / f"{name}.lance"), "engine": "in_process", "schedule": None,
                      "thresholds": {"max_unmerged_generations": 1}, "alerts": {"webhook_conn_id": ""}}
               for name in ("alpha", "beta", "gone")}
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", entries)))

    result = monitor.check_fleet(notifiers=[_notifier(recorded)], max_workers=2)

    assert result["tables"] == 3 and sorted(result["failed"]) == ["gone"], result
    assert "gone.lance" in result["failed"]["gone"] and "gone.lance" in result["probe_failed"]["gone"]
    assert result["breached"] == ["alpha", "beta", "gone"] and result["alerts"] == dict.fromkeys(
        ["alpha", "beta", "gone"], "firing")
    assert result["due"]["merge"] == 2, "alpha and beta have unmerged generations: merge is due on both"
    rows = fleet_status.load(fleet_status.LAG_MONITOR)["tables"]
    assert rows["gone"]["error"] and rows["gone"]["probe"]["status"] == "not_a_table"
    assert rows["gone"]["breaches"] == [f"table: lag not measured: {rows['gone']['error']}"]
    assert rows["alpha"]["unmerged_generations"] == 4 and rows["beta"]["unmerged_generations"] == 2
    assert rows["alpha"]["probe"]["due"][0]["job"] == "merge" and "merge" not in rows["alpha"]["probe"]["not_due"]
    assert recorded["stores"]["alpha"].values[history.PROBE_STATE_KEY]["table_uri"].endswith("alpha.lance"), (
        "the probe's state is kept for the next cycle")
    cycle = {"gauges": recorded["gauges"], "alerts": recorded["alerts"]}
    assert set(cycle["gauges"]) == {"alpha", "beta"}, "no gauges for a table not measured (as per table)"

    recorded["reset"]()  # the same tables, checked one by one as the per-table monitor did, from fresh state
    for cfg in load_tables(use_variable=False).values():
        monitor.check_table_lag(cfg, notifiers=[_notifier(recorded)])
    assert cycle["gauges"] == recorded["gauges"], "each table's gauges are those of the per-table check"
    assert cycle["alerts"] == recorded["alerts"], "each table's alerts are those of the per-table check"
    assert len(cycle["gauges"]["alpha"]) > len(cycle["gauges"]["beta"]) > 10


def test_second_cycle_probes_an_unchanged_table_from_its_state_and_a_fleet_table_is_left_to_the_fleet_probe(
        tmp_path, monkeypatch, recorded):
    loc = SimpleNamespace(kind="local", uri=str(tmp_path / "t.lance"), storage_options=None)
    build_table(loc, regions=1, generations=2)
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", {"t": {
        "uri": loc.uri, "engine": "in_process", "schedule": None, "thresholds": {"max_unmerged_generations": 1},
        "alerts": {"webhook_conn_id": ""}}})))
    first = monitor.check_fleet(notifiers=[_notifier(recorded)])
    second = monitor.check_fleet(notifiers=[_notifier(recorded)])
    rows = fleet_status.load(fleet_status.LAG_MONITOR)["tables"]
    assert first["alerts"] == {"t": "firing"} and second["alerts"] == {}, "already alerted: nothing new"
    assert rows["t"]["probe"]["changed"] is False, "unchanged since the last cycle: the probe read its state"
    assert rows["t"]["breaches"] and rows["t"]["alert_state"]["since"], "still behind, and since when"
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "fleet.yaml", {"f": {
        "uri": loc.uri, "engine": "in_process", "schedule": None, "fleet": True, "alerts": {"webhook_conn_id": ""}}})))
    monitor.check_fleet(notifiers=[_notifier(recorded)])
    fleet_row = fleet_status.load(fleet_status.LAG_MONITOR)["tables"]["f"]
    assert fleet_row["probe"] is None and fleet_row["unmerged_generations"] == 2, "measured, probed by the fleet DAG"
    assert history.PROBE_STATE_KEY not in recorded["stores"]["f"].values


def test_a_bad_concurrency_is_named(monkeypatch):
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv(monitor.CONCURRENCY_ENV, bad)
        with pytest.raises(ValueError, match=rf"\$MEMWAL_LAG_MONITOR_CONCURRENCY .*{bad!r}"):
            monitor.concurrency()
    monkeypatch.setenv(monitor.CONCURRENCY_ENV, "3")
    assert monitor.concurrency() == 3


def test_a_table_with_a_corrupt_region_manifest_is_reported_with_the_object_and_still_measured(
        tmp_path, monkeypatch, recorded):
    """Issue 43 item 6: the probe's error (naming the table and the object) is in the table's row for the page;
    the lag is still measured (the unreadable region is a breach, as per table)."""
    from memwal import naming
    from memwal.region_manifest import latest_version

    loc = SimpleNamespace(kind="local", uri=str(tmp_path / "t.lance"), storage_options=None)
    regions = build_table(loc, regions=2, generations=1)
    from memwal.storage import ObjectStore

    path = naming.manifest_path(regions[0], latest_version(ObjectStore(loc.uri), regions[0]))
    (tmp_path / "t.lance" / path).write_bytes(b"not a manifest")
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", {"t": {
        "uri": loc.uri, "engine": "in_process", "schedule": None, "alerts": {"webhook_conn_id": ""}}})))
    result = monitor.check_fleet(notifiers=[_notifier(recorded)])
    row = fleet_status.load(fleet_status.LAG_MONITOR)["tables"]["t"]
    assert result["failed"] == {} and path in result["probe_failed"]["t"]
    assert row["probe"]["status"] == "error" and path in row["probe"]["error"] and regions[0] in row["probe"]["error"]
    assert row["error"] is None and any(regions[0] in b for b in row["breaches"]), row["breaches"]


def test_a_cycle_checks_tables_concurrently_and_never_more_than_its_bound(tmp_path, monkeypatch, recorded):
    """9 tables, at most 3 at once: every check waits at a barrier of 3, so the cycle only finishes if 3 checks
    run together, and the most ever running at once is 3."""
    import threading

    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", {
        f"t{i}": {"uri": str(tmp_path / f"t{i}.lance"), "engine": "in_process", "schedule": None}
        for i in range(9)})))
    barrier = threading.Barrier(3, timeout=60)
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def check(cfg, notifiers=None, context=None):
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        barrier.wait()
        with lock:
            running["now"] -= 1
        return {"table": cfg.name, "at": "2026-11-27T12:00:00+00:00", "error": None, "breaches": [], "alert": None,
                "memwal_table": context["memwal_table"]}

    monkeypatch.setattr(monitor, "check_table_lag", check)
    result = monitor.check_fleet(max_workers=3, probe=False)
    assert result["tables"] == 9 and result["failed"] == {} and running["most"] == 3, running


def test_rows_that_cannot_be_saved_are_reported_after_every_table_was_checked(tmp_path, monkeypatch, recorded):
    loc = SimpleNamespace(kind="local", uri=str(tmp_path / "t.lance"), storage_options=None)
    build_table(loc, regions=1, generations=1)
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "tables.yaml", {"t": {
        "uri": loc.uri, "engine": "in_process", "schedule": None, "alerts": {"webhook_conn_id": ""}}})))

    class Refusing:
        def set(self, key, value):
            raise OSError(f"Variable {key} refused")

    monkeypatch.setattr(fleet_status, "_backend", lambda: Refusing())
    result = monitor.check_fleet(notifiers=[])
    assert result["status_error"] == ("fleet status not saved: Variable memwal_fleet_status__lag_monitor refused")
    assert set(recorded["gauges"]) == {"t"} and result["failed"] == {}, "the table was checked and its gauges sent"
