"""MemWalLagSensor: pokes once, defers to the lag trigger when it has to wait (TaskDeferred: the wait is in
the triggerer), and completes with the trigger's event; a table already within returns at once."""

from __future__ import annotations

import asyncio
import json

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from airflow_support import lance_core_table, tables_file

from memwal.airflow.sensors.memwal import MemWalLagSensor
from memwal.airflow.triggers.memwal import MemWalLagTrigger
from memwal.merge import merge_table


@pytest.fixture
def table(local_location, tmp_path, monkeypatch):
    lance_core_table(local_location, regions=1, generations=3)
    path = tables_file(tmp_path / "tables.yaml", {"orders": {
        "uri": local_location.uri, "engine": "in_process", "thresholds": {"max_unmerged_generations": 2}}})
    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(path))
    return local_location


def test_defers_then_completes_when_merged(table):
    sensor = MemWalLagSensor(task_id="wait_caught_up", table="orders", poke_interval=0.01, timeout=600,
                             deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, MemWalLagTrigger) and deferred.value.method_name == "execute_complete"
    _, kwargs = trigger.serialize()
    assert kwargs["table_uri"] == table.uri and kwargs["thresholds"] == {"max_unmerged_generations": 2}
    assert kwargs["wait_for"] == "within" and deferred.value.timeout.total_seconds() == 600
    json.dumps(kwargs)

    merge_table(table.uri)  # the table catches up while the sensor waits in the triggerer
    event = asyncio.run(asyncio.wait_for(trigger.run().__anext__(), timeout=120))
    result = sensor.execute_complete({}, event.payload)
    assert result["breached"] is False and result["unmerged_generations"] == 0 and result["table"] == "orders"


def test_within_thresholds_returns_without_deferring(table):
    merge_table(table.uri)
    result = MemWalLagSensor(task_id="s", table="orders").execute({})
    assert result["unmerged_generations"] == 0 and not result["breaches"]


def test_wait_for_breached_returns_at_once_when_behind(table):
    result = MemWalLagSensor(task_id="s", table="orders", wait_for="breached").execute({})
    assert result["breached"] and result["breaches"][0]["metric"] == "unmerged_generations"


def test_trigger_error_fails_the_task_with_its_line(table):
    sensor = MemWalLagSensor(task_id="s", table="orders")
    with pytest.raises(AirflowException, match="storage down"):
        sensor.execute_complete({}, {"status": "error", "message": "table orders: storage down"})


def test_unknown_table_is_one_clear_error(table):
    with pytest.raises(Exception, match=r"nope.*no such table"):
        MemWalLagSensor(task_id="s", table="nope").execute({})


def test_a_bad_tables_file_fails_the_sensor_without_retry(table, tmp_path, monkeypatch):
    """A config error (bad or unknown entry) is AirflowFailException: Airflow fails the task, no retry."""
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("MEMWAL_TABLES_FILE", str(tables_file(tmp_path / "bad.yaml", {"orders": {
        "uri": table.uri, "thresholds": {"max_unmerged_generations": -1}}})))
    for deferrable in (True, False):
        with pytest.raises(AirflowFailException, match=r"table 'orders', key 'thresholds\.max_unmerged_generations'"):
            MemWalLagSensor(task_id="s", table="orders", deferrable=deferrable).execute({})
    with pytest.raises(AirflowFailException, match="no such table"):
        MemWalLagSensor(task_id="s", table="nope").execute({})
