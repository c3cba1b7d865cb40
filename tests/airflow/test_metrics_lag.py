"""Lag metrics reach StatsD: received on a loopback UDP socket, each name and value checked against
`memwal status --json` of a table that Lance core's writer wrote."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from airflow_support import lance_core_table

from memwal.airflow.metrics import emit_lag_metrics, metric_table_name
from memwal.lag import measure

MEMWAL = str(Path(sys.executable).with_name("memwal"))


@pytest.fixture
def statsd_socket(monkeypatch):
    """A UDP socket on 127.0.0.1 and Airflow's task-SDK Stats pointed at it ([metrics] statsd_on)."""
    from airflow.sdk._shared.observability.metrics import stats as stats_module
    from airflow.sdk.observability.metrics.stats_utils import get_stats_factory
    from airflow.sdk.observability.stats import Stats

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(20)
    for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(sock.getsockname()[1]),
                       "STATSD_PREFIX": "airflow"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    monkeypatch.setattr(stats_module, "_factory", stats_module._factory)  # restored after the test
    monkeypatch.setattr(stats_module, "_backend", stats_module._backend)
    Stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    yield sock
    sock.close()


def _receive(sock, count: int) -> dict[str, float]:
    got: dict[str, float] = {}
    while len(got) < count:
        for line in sock.recv(65535).decode().splitlines():
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            assert kind == "g", f"{name} is sent as a gauge"
            got[name] = float(value)
    return got


def test_gauges_match_memwal_status(local_location, statsd_socket):
    loc = local_location
    regions = lance_core_table(loc, regions=2, generations=2)
    cli = json.loads(subprocess.run([MEMWAL, "status", loc.uri, "--json"], capture_output=True, text=True,
                                    check=True).stdout)
    summary = measure(loc.uri)
    sent = emit_lag_metrics("orders.eu", summary, breaches=1)
    measured = {r["region_id"]: r for r in summary["regions"]}
    got = _receive(statsd_socket, len(sent))
    t = metric_table_name("orders.eu")
    assert t == "orders_eu", "a dot in the table name would add a StatsD level"
    assert set(got) == {f"airflow.{name}" for name, _ in sent}
    by_region = {r["region_id"]: r for r in cli["regions"]}
    assert set(by_region) == set(regions)
    for rid, r in by_region.items():
        p = f"airflow.memwal.{t}.{rid}"
        assert r["unmerged_generations"] == 2
        for key in ("unmerged_generations", "unmerged_rows", "unmerged_bytes", "index_lag_generations"):
            assert got[f"{p}.{key}"] == r[key], f"{p}.{key} equals memwal status"
        age = got[f"{p}.oldest_unmerged_age_s"]
        assert age == measured[rid]["oldest_unmerged_age_s"], "the gauge sends the measured age unchanged"
        assert 0 < r["oldest_unmerged_age_s"] <= age, "same generations, measured after the CLI: no younger"
        assert got[f"{p}.unreadable"] == 0
    for key in ("unmerged_generations", "unmerged_rows", "unmerged_bytes"):
        assert got[f"airflow.memwal.{t}.{key}"] == cli[key], f"table {key} equals memwal status"
    assert got[f"airflow.memwal.{t}.index_lag_generations"] == cli["max_index_lag_generations"]
    assert got[f"airflow.memwal.{t}.regions"] == cli["num_regions"] == 2
    assert got[f"airflow.memwal.{t}.breaches"] == 1
    assert f"airflow.memwal.{t}.snapshot_age_s" not in got, "no snapshot written yet: no snapshot age sent"


def test_snapshot_age_is_sent_once_a_snapshot_exists(local_location, statsd_socket):
    from memwal.mem_wal_index import load_index
    from memwal.snapshot import refresh_snapshot

    loc = local_location
    lance_core_table(loc, regions=1, generations=1)
    refresh_snapshot(loc.uri)
    written = load_index(loc.uri).details.snapshot_ts_millis / 1000.0
    summary = measure(loc.uri, now=written + 42.5)  # a fixed clock: the age is observed, not timed
    sent = dict(emit_lag_metrics("t", summary))
    got = _receive(statsd_socket, len(sent))
    assert got["airflow.memwal.t.snapshot_age_s"] == 42.5


def test_health_gauges_match_memwal_status_health(local_location, statsd_socket):
    """With health measured (the lag monitor's measurement, with a storage reading), fragments, versions and
    bytes are gauges too, each equal to `memwal status --json`'s health."""
    loc = local_location
    lance_core_table(loc, regions=1, generations=2)
    cli = json.loads(subprocess.run([MEMWAL, "status", loc.uri, "--json"], capture_output=True, text=True,
                                    check=True).stdout)["health"]
    summary = measure(loc.uri, health=True, storage=True)
    sent = dict(emit_lag_metrics("t", summary))
    got = _receive(statsd_socket, len(sent))
    for key in ("fragments", "small_fragments", "deleted_ratio", "data_bytes", "table_versions", "base_bytes",
                "mem_wal_bytes", "gc_reclaimable_bytes"):
        assert got[f"airflow.memwal.t.{key}"] == cli[key], f"health gauge {key} equals memwal status"
    assert cli["mem_wal_bytes"] > 0 and cli["table_versions"] >= 2
