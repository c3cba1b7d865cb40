"""The lag monitor's health: counted against the table's own compaction policy, the same as the page; the
storage reading (a listing and a GC dry run over every retained version) taken at its own slower cadence
and reused in between, with the time it was taken. In process: the lag asset's state store is replaced by a
dict and the gauges are recorded instead of sent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from airflow_support import DictStore

from memwal.airflow import history, monitor
from memwal.airflow.config import TableConfig, Thresholds
from memwal.maintenance_config import CompactionConfig
from memwal.merge import merge_table

from support.maintenance import build_table
from support.open_counts import count_opens


@pytest.fixture
def state(monkeypatch) -> dict:
    """The lag assets' state stores (one dict per table) and the gauges each check sent."""
    stores: dict = {}
    sent: list = []
    monkeypatch.setattr(history, "_store", lambda table: stores.setdefault(table, DictStore()))
    monkeypatch.setattr(monitor, "emit_lag_metrics", lambda table, summary, n: sent.append(summary) or [])
    monkeypatch.delenv("MEMWAL_HEALTH_STORAGE_INTERVAL_S", raising=False)
    return {"stores": stores, "sent": sent}


@pytest.fixture
def table(local_location):
    """Two regions merged: two fragments of 10 rows each."""
    build_table(local_location, regions=2, generations=3)
    merge_table(local_location.uri)
    return local_location


def test_small_fragments_use_the_tables_compaction_target_in_the_monitor_and_on_the_page(table, state):
    """Target 20 rows: a 10-row fragment is not small (under half the target is); against the default target
    (1,048,576) both are. The lag monitor (its gauge and its `max_small_fragments` alert) and the page
    count the same."""
    from memwal.airflow.ui.sources import table_status

    cfg = TableConfig(name="t", uri=table.uri, compaction=CompactionConfig(target_rows_per_fragment=20),
                      thresholds=Thresholds(max_small_fragments=1))
    result = monitor.check_table_lag(cfg, notifiers=[])
    page, _ = table_status(cfg)
    assert result["health"]["small_fragments"] == page["health"]["small_fragments"] == 0
    assert result["health"]["target_rows_per_fragment"] == page["health"]["target_rows_per_fragment"] == 20
    assert state["sent"][-1]["health"]["small_fragments"] == 0, "the gauge sent is the same count"
    assert result["breaches"] == [], "no small-fragment alert the page would contradict"

    default = TableConfig(name="d", uri=table.uri, thresholds=Thresholds(max_small_fragments=1))
    result = monitor.check_table_lag(default, notifiers=[])
    assert result["health"]["small_fragments"] == table_status(default)[0]["health"]["small_fragments"] == 2
    assert result["breaches"] == ["table: small_fragments 2 > 1"]


def test_storage_reading_is_taken_once_per_interval_and_reused_with_its_time(table, state):
    """Checks at t0, t0 + 10 min, t0 + 61 min (interval 1 h): the storage reading (GC dry run: one index read
    per older retained version) is taken at t0 and t0 + 61 min only; in between the kept one is used, and
    every check still has the storage figures and says when they were taken."""
    cfg = TableConfig(name="t", uri=table.uri, thresholds=Thresholds(max_mem_wal_bytes=1))
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    loads = []
    for at in (t0, t0 + timedelta(minutes=10), t0 + timedelta(minutes=61)):
        with count_opens(table.uri) as counts:
            result = monitor.check_table_lag(cfg, notifiers=[], at=at)
        loads.append(counts["index"])
        health = result["health"]
        assert health["gc_reclaimable_bytes"] is not None and health["mem_wal_bytes"] > 1
        assert "table: mem_wal_bytes" in " ".join(result["breaches"]), "the kept figure is still alerted on"
        assert health["storage_measured_at"] == (t0 + timedelta(minutes=61 if at > t0 + timedelta(minutes=60)
                                                               else 0)).isoformat(timespec="seconds")
    assert loads[0] == loads[2] > loads[1] == 1, f"index loads per check: {loads}"
    kept = state["stores"]["t"].values[history.STORAGE_HEALTH_KEY]
    assert kept["storage_measured_at"] == (t0 + timedelta(minutes=61)).isoformat(timespec="seconds")
    assert kept["table_uri"] == table.uri

    moved = TableConfig(name="t", uri=table.uri + "/", thresholds=cfg.thresholds)
    with count_opens(table.uri) as counts:
        result = monitor.check_table_lag(moved, notifiers=[], at=t0 + timedelta(minutes=62))
    assert counts["index"] > 1 and result["health"]["storage_measured_at"].endswith("13:02:00+00:00"), (
        "a reading kept for another URI is not reused")


def test_storage_interval_zero_reads_every_time_and_a_bad_value_is_named(table, state, monkeypatch):
    cfg = TableConfig(name="t", uri=table.uri)
    monkeypatch.setenv(monitor.STORAGE_INTERVAL_ENV, "0")
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    first = monitor.check_table_lag(cfg, notifiers=[], at=t0)
    second = monitor.check_table_lag(cfg, notifiers=[], at=t0 + timedelta(seconds=1))
    assert first["health"]["storage_measured_at"] != second["health"]["storage_measured_at"]
    for bad in ("soon", "-5", "nan", "inf"):
        monkeypatch.setenv(monitor.STORAGE_INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=rf"\$MEMWAL_HEALTH_STORAGE_INTERVAL_S .*{bad!r}"):
            monitor.check_table_lag(cfg, notifiers=[], at=t0)


def test_a_failed_storage_reading_keeps_the_last_one_and_the_lag_check_goes_on(table, state, monkeypatch):
    import memwal.health

    cfg = TableConfig(name="t", uri=table.uri, thresholds=Thresholds(max_unmerged_generations=100))
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    first = monitor.check_table_lag(cfg, notifiers=[], at=t0)

    def fail(_table):
        raise OSError("listing refused")

    monkeypatch.setattr(memwal.health, "storage_health", fail)
    later = monitor.check_table_lag(cfg, notifiers=[], at=t0 + timedelta(hours=2))
    assert later["error"] is None and later["breaches"] == []
    assert later["health"]["storage_measured_at"] == first["health"]["storage_measured_at"]
