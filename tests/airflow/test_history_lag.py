"""Lag history and alert state: kept in the lag asset's state store in the metadata DB, read back from
another process outside any task (as the UI page does), with bounded retention."""

from __future__ import annotations

import json

import pytest
from lag_support import lag_run

from memwal.airflow import alerts
from memwal.airflow.history import BUCKET_SAMPLES, sample_of


@pytest.fixture(scope="module")
def retention(airflow_home) -> dict:
    """Both retention scenarios in one child process (Airflow starts once)."""
    specs = [
        {"table": "lag_hist_age", "samples": 40, "every_minutes": 60, "retention_days": 1, "max_samples": 1000,
         "since_index": 35},
        {"table": "lag_hist_rows", "samples": 100, "every_minutes": 1, "retention_days": 30, "max_samples": 30,
         "since_index": 0},
    ]
    by_age, by_rows = lag_run(airflow_home, "history", json.dumps(specs))
    return {"age": by_age, "rows": by_rows}


def test_history_needs_the_registered_lag_asset(retention):
    out = retention["age"]
    assert out["before"] == [] and "not registered" in out["unregistered_error"]
    assert "memwal_lag__lag_hist_age" in out["unregistered_error"]


def test_retention_by_age_keeps_the_last_days(retention):
    """40 hourly samples, 1 day kept: samples from hour 12 on survive (whole buckets of 12 go)."""
    out = retention["age"]
    kept = [s["unmerged_generations"] for s in out["read"]]
    assert kept == list(range(12, 40)), "every sample of the last day kept, older buckets deleted"
    assert [s["unmerged_generations"] for s in out["read_since"]] == [35, 36, 37, 38, 39]
    assert out["read"][0]["regions"]["r1"]["unmerged_generations"] == 12


def test_retention_by_count_bounds_the_rows(retention):
    out = retention["rows"]
    kept = [s["unmerged_generations"] for s in out["read"]]
    assert 30 <= len(kept) < 30 + BUCKET_SAMPLES and kept[-1] == 99 and kept == sorted(kept)
    buckets = -(-len(kept) // BUCKET_SAMPLES)
    assert out["state_store_rows"] <= buckets + 1, "asset_state_store keeps only live buckets and the index"


def test_sample_is_compact_and_json(tmp_path):
    from datetime import UTC, datetime

    summary = {"table_version": 3, "num_regions": 1, "unmerged_generations": 2, "snapshot_age_s": 5.0,
               "breaches": [{"message": "region r: unmerged_generations 2 > 1"}],
               "regions": [{"region_id": "r", "unmerged_generations": 2, "flushed_generations": list(range(500))}]}
    s = sample_of("t", summary, datetime(2026, 1, 1, tzinfo=UTC))
    assert s["at"] == "2026-01-01T00:00:00.000+00:00" and s["breaches"] == ["region r: unmerged_generations 2 > 1"]
    assert "flushed_generations" not in s["regions"]["r"], "per-region lists are not kept in the history"
    json.dumps(s)


def _b(key: str) -> dict:
    return {"key": key, "region_id": key.split(":")[0], "metric": key.split(":")[1], "value": 5, "threshold": 4,
            "message": f"{key} 5 > 4"}


def test_alert_state_alerts_once_per_crossing():
    """runs: A behind -> A -> A,B -> B -> none -> none -> A: firing, -, firing (B new), -, resolved, -, firing."""
    sequence = [["a:g"], ["a:g"], ["a:g", "b:g"], ["b:g"], [], [], ["a:g"]]
    state: dict = {}
    sent = []
    for i, keys in enumerate(sequence):
        alert, state = alerts.transition("t", [_b(k) for k in keys], state, f"2026-01-01T00:0{i}:00")
        sent.append(alert["state"] if alert else None)
        state = json.loads(json.dumps(state))  # what the state store keeps
    assert sent == ["firing", None, "firing", None, "resolved", None, "firing"]
    assert state["since"] == "2026-01-01T00:06:00", "a new episode starts its own 'since'"


def test_failed_delivery_raises_and_names_the_notifier():
    def broken(context):
        raise RuntimeError("pager down")

    delivered = []
    alert = {"table": "t", "state": "firing"}
    try:
        alerts.send(alert, [delivered.append, broken], {"dag": None})
    except alerts.AlertDeliveryError as exc:
        assert "1 of 2" in str(exc) and "pager down" in str(exc)
    else:
        raise AssertionError("a failed notifier must fail the send (so the state is not advanced)")
    assert delivered[0]["memwal_alert"] == alert, "the other notifiers still got the alert in their context"


def test_configured_notifier_entries_are_built():
    n = alerts.build_notifier({"class": "memwal.airflow.notifications.webhook.MemWalWebhookNotifier",
                               "kwargs": {"webhook_conn_id": "pager"}}, "t")
    assert n.webhook_conn_id == "pager"
    try:
        alerts.build_notifier("no.such.Notifier", "orders")
    except ValueError as exc:
        assert "orders" in str(exc) and "no.such.Notifier" in str(exc)
    else:
        raise AssertionError("an unimportable notifier must be one clear error")


def test_a_sample_keeps_the_regions_furthest_behind():
    from datetime import UTC, datetime

    from memwal.airflow.history import MAX_REGIONS_PER_SAMPLE

    regions = [{"region_id": f"r{i}", "unmerged_generations": i} for i in range(100)]
    regions.append({"region_id": "broken", "unmerged_generations": 0, "error": "manifest unreadable"})
    s = sample_of("t", {"num_regions": 101, "regions": regions}, datetime(2026, 1, 1, tzinfo=UTC))
    assert len(s["regions"]) == MAX_REGIONS_PER_SAMPLE and "broken" in s["regions"], "unreadable ones first"
    assert "r99" in s["regions"] and "r0" not in s["regions"] and s["num_regions"] == 101
