"""The lag triggers: serialize round trip, the event trigger fires on each crossing (and not while below or
while still behind), and storage credentials come from the connection inside run(), never from kwargs."""

from __future__ import annotations

import asyncio
import importlib
import json

import pytest
from airflow_support import add_generations, lance_core_table

from memwal.airflow.triggers.memwal import MemWalLagEventTrigger, MemWalLagTrigger
from memwal.merge import merge_table

from support.s3_decoy import NOT_REACHED


def _roundtrip(trigger):
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls is type(trigger)
    json.dumps(kwargs)  # stored in the metadata DB: must be plain JSON
    again = cls(**kwargs)
    assert again.serialize() == (path, kwargs)
    return kwargs


def test_serialize_round_trip_holds_every_argument():
    event = MemWalLagEventTrigger(table="orders", table_uri="s3://lake/orders", conn_id="lake",
                                  thresholds={"max_unmerged_generations": 5, "max_snapshot_age_s": 60},
                                  poll_interval_s=30)
    assert _roundtrip(event) == {"table": "orders", "table_uri": "s3://lake/orders", "conn_id": "lake",
                                 "thresholds": {"max_unmerged_generations": 5, "max_snapshot_age_s": 60},
                                 "poll_interval_s": 30.0}
    plain = MemWalLagTrigger(table="orders", table_uri="/t", thresholds={"max_index_lag": 1}, wait_for="breached")
    assert _roundtrip(plain)["wait_for"] == "breached"


def test_bad_threshold_names_the_key():
    with pytest.raises(ValueError, match="max_unmerged_rows"):
        MemWalLagEventTrigger(table="t", table_uri="/t", thresholds={"max_unmerged_rows": 1})


def test_event_trigger_fires_once_per_crossing(local_location):
    """gens: 3 (limit 4) -> 3 -> write 2 -> 5: fire -> 5: still behind, no event -> merge -> 0 ->
    write 5 -> 5: fire again. Events are counted against polls, no timing involved."""
    loc = local_location
    (region,) = lance_core_table(loc, regions=1, generations=3)
    trigger = MemWalLagEventTrigger(table="t", table_uri=loc.uri, thresholds={"max_unmerged_generations": 4},
                                    poll_interval_s=0.01)
    polls: list[int] = []
    real_poll = trigger._poll
    after_poll = {2: lambda: add_generations(loc, region, 2, start=7000), 4: lambda: merge_table(loc.uri),
                  5: lambda: add_generations(loc, region, 5, start=9000)}

    async def counting_poll():
        summary, found = await real_poll()
        polls.append(summary["unmerged_generations"])
        if len(polls) in after_poll:
            after_poll[len(polls)]()
        return summary, found

    trigger._poll = counting_poll

    async def two_events():
        events = []
        agen = trigger.run()
        for _ in range(2):
            event = await asyncio.wait_for(agen.__anext__(), timeout=120)
            events.append((len(polls), event.payload))
        await agen.aclose()
        return events

    events = asyncio.run(two_events())
    assert polls == [3, 3, 5, 5, 0, 5], polls
    assert [at for at, _ in events] == [3, 6], "an event at each crossing, none below or while still behind"
    payload = events[0][1]
    assert payload["table"] == "t" and payload["breached"] and payload["unmerged_generations"] == 5
    assert [(b["region_id"], b["metric"], b["value"]) for b in payload["breaches"]] == [
        (region, "unmerged_generations", 5)]


def test_plain_trigger_fires_when_within(local_location):
    loc = local_location
    lance_core_table(loc, regions=1, generations=1)
    trigger = MemWalLagTrigger(table="t", table_uri=loc.uri, thresholds={"max_unmerged_generations": 0},
                               poll_interval_s=0.01)

    polls: list[int] = []
    real_poll = trigger._poll

    async def counting_poll():
        summary, found = await real_poll()
        polls.append(summary["unmerged_generations"])
        if len(polls) == 2:
            merge_table(loc.uri)
        return summary, found

    trigger._poll = counting_poll

    async def first():
        return await asyncio.wait_for(trigger.run().__anext__(), timeout=120)

    event = asyncio.run(first())
    assert polls == [1, 1, 0], "waits while 1 unmerged generation > 0, fires once merged"
    assert event.payload["status"] == "success" and event.payload["unmerged_generations"] == 0


def _s3_trigger(loc, monkeypatch, removed: str | None = None) -> MemWalLagEventTrigger:
    """The event trigger on loc through a `memwal` env connection, with the endpoint (host) or the keys
    (login, password) removed from that connection for a positive control."""
    opts = loc.storage_options
    conn = {"conn_type": "memwal", "host": opts["aws_endpoint"], "login": opts["aws_access_key_id"],
            "password": opts["aws_secret_access_key"], "extra": {"region": "us-east-1", "allow_http": True}}
    for field in {"endpoint": ("host",), "keys": ("login", "password"), None: ()}[removed]:
        conn.pop(field)
    monkeypatch.setenv("AIRFLOW_CONN_LAG_S3", json.dumps(conn))
    return MemWalLagEventTrigger(table="s3t", table_uri=loc.uri, conn_id="lag_s3",
                                 thresholds={"max_unmerged_generations": 1}, poll_interval_s=0.01)


@pytest.mark.s3
def test_event_trigger_reads_s3_through_the_connection(s3_location, monkeypatch):
    """Credentials live in the `memwal` connection (here an env connection); kwargs name it only."""
    loc = s3_location
    lance_core_table(loc, regions=1, generations=2)
    opts = loc.storage_options
    trigger = _s3_trigger(loc, monkeypatch)
    assert opts["aws_secret_access_key"] not in json.dumps(trigger.serialize()[1])

    async def first():
        agen = trigger.run()
        event = await asyncio.wait_for(agen.__anext__(), timeout=120)
        await agen.aclose()
        return event

    event = asyncio.run(first())
    assert event.payload["unmerged_generations"] == 2 and event.payload["table_uri"] == loc.uri


@pytest.mark.s3
@pytest.mark.parametrize("removed", ["endpoint", "keys"])
def test_event_trigger_cannot_read_s3_without_the_connections_endpoint_or_keys(s3_location, monkeypatch, removed):
    """Positive control of the test above: the same trigger whose connection lost its endpoint or keys
    cannot measure the table (the environment reaches no S3), so that test passes only through the
    connection. One poll, observed directly (the trigger itself logs the failure and keeps watching)."""
    loc = s3_location
    lance_core_table(loc, regions=1, generations=2)
    trigger = _s3_trigger(loc, monkeypatch, removed)
    with pytest.raises(Exception, match=NOT_REACHED):
        asyncio.run(trigger._poll())


def test_maintenance_dag_registers_the_watcher_without_secrets(airflow_home, local_location, tmp_path):
    """The DAG processor's view: the maintenance DAG is scheduled on the lag asset, so the asset gets the
    event trigger; its kwargs in the metadata DB name the connection and never hold its secret."""
    import subprocess
    import sys
    from pathlib import Path

    from airflow_support import tables_file
    from lag_support import lag_run

    env = {
        **airflow_home,
        "MEMWAL_TABLES_FILE": str(tables_file(tmp_path / "tables.yaml", {"lagwatch": {
            "uri": local_location.uri, "conn_id": "lagwatch_store", "engine": "in_process",
            "thresholds": {"max_unmerged_generations": 2, "max_snapshot_age_s": 600}}})),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",  # watchers run for unpaused DAGs only
        "AIRFLOW_CONN_LAGWATCH_STORE": json.dumps({"conn_type": "memwal", "login": "AKIAWATCH",
                                                   "password": "CANARY-not-in-trigger-kwargs"}),
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    proc = subprocess.run([airflow, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = lag_run(env, "watchers", "memwal_lag__lagwatch")
    assert out["uri"] == "memwal://lagwatch/lag"
    assert out["triggers"] == [{"classpath": "memwal.airflow.triggers.memwal.MemWalLagEventTrigger", "kwargs": {
        "table": "lagwatch", "table_uri": local_location.uri, "conn_id": "lagwatch_store",
        "thresholds": {"max_unmerged_generations": 2, "max_snapshot_age_s": 600}, "poll_interval_s": 60.0}}]
    assert "CANARY" not in json.dumps(out) and "AKIAWATCH" not in json.dumps(out)


def test_the_status_is_read_off_the_event_loop(monkeypatch):
    """The measurement blocks until a coroutine on the event loop opens a gate: if it ran on the loop's
    thread (blocking the triggerer), the gate would never open."""
    import threading

    from memwal.airflow.triggers import memwal as triggers

    started, gate = threading.Event(), threading.Event()
    blocked = []

    def blocking_measure(table):
        started.set()
        if not gate.wait(timeout=60):
            blocked.append(table.uri)
            raise TimeoutError("gate never opened")
        return {"table_uri": table.uri, "num_regions": 1, "unmerged_generations": 9,
                "regions": [{"region_id": "r", "unmerged_generations": 9}]}

    monkeypatch.setattr(triggers, "measure", blocking_measure)
    trigger = MemWalLagEventTrigger(table="t", table_uri="/t", thresholds={"max_unmerged_generations": 1},
                                    poll_interval_s=0.01)

    async def main():
        async def open_gate():  # a coroutine on the loop: it only runs if the loop is free
            while not started.is_set():
                await asyncio.sleep(0.01)
            gate.set()

        opener = asyncio.ensure_future(open_gate())
        event = await asyncio.wait_for(trigger.run().__anext__(), timeout=120)
        await opener
        return event

    assert asyncio.run(main()).payload["unmerged_generations"] == 9
    assert not blocked, "the event loop was blocked while the status was read"
