"""How often the Airflow parts open a table: a sensor poke and an in-process merge through the hook."""

from __future__ import annotations

from airflow_support import lance_core_table, tables_file

from memwal.airflow.config import get_table
from memwal.airflow.hooks.memwal import MemWalHook
from memwal.airflow.sensors.memwal import MemWalLagSensor

from support.open_counts import count_opens


def _table(location, tmp_path, monkeypatch) -> None:
    lance_core_table(location, regions=2, generations=3)
    path = tables_file(tmp_path / "tables.yaml", {"orders": {
        "uri": location.uri, "engine": "in_process", "thresholds": {"max_unmerged_generations": 2}}})
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))


def test_sensor_poke_opens_the_table_once(local_location, tmp_path, monkeypatch):
    _table(local_location, tmp_path, monkeypatch)
    sensor = MemWalLagSensor(task_id="s", table="orders", deferrable=False)
    with count_opens(local_location.uri) as counts:
        assert sensor.poke({}).is_done is False
    print("sensor poke:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1}, "a poke opens and loads the table once"


def test_hook_merge_opens_the_table_once(local_location, tmp_path, monkeypatch):
    _table(local_location, tmp_path, monkeypatch)
    with count_opens(local_location.uri) as counts:
        run = MemWalHook.for_table(get_table("orders")).run_job("merge", get_table("orders"))
    assert run.returncode == 0 and run.summary["generations_merged"] == 6
    print("hook merge:", dict(counts))
    assert dict(counts) == {"dataset": 1, "store": 1, "index": 1}, (
        "a merge through the hook opens the table once and loads the index once (no deletes: one upsert pass, "
        "on the version it planned on)")
