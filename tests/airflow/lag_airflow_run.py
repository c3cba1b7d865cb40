"""Run as a child process by the lag tests in the session's Airflow home (its SQLite metadata DB), outside
any task, as the api-server (the UI page) reads the lag history:

    lag_airflow_run.py monitor SPEC_JSON   dag.test() of memwal_lag_monitor once per entry of SPEC["runs"]
                                           ("merge": merge SPEC["uri"] first); each run's task states, tries,
                                           check_tables result and the fleet status rows the page reads
                                           (several runs in one process: Airflow starts once)
    lag_airflow_run.py read TABLE          the table's history and alert state
    lag_airflow_run.py watchers ASSET      the triggers registered on an asset (decrypted kwargs)
    lag_airflow_run.py history SPECS_JSON  per spec: record many samples and read them back (retention)

Prints one line: RESULT <json>."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta


def _value(xcom) -> object:
    from airflow.models.xcom import XComModel

    value = XComModel.deserialize_value(xcom)
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def monitor(spec: dict) -> dict:
    import os

    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    from memwal.airflow import fleet_status
    from memwal.merge import merge_table

    dag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags["memwal_lag_monitor"]
    runs = []
    for step in spec["runs"]:
        if step == "merge":
            merge_table(spec["uri"])
        dr = dag.test()
        session = settings.Session()
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id,
                                                         TaskInstance.run_id == dr.run_id)).all()
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag.dag_id,
                                                        XComModel.run_id == dr.run_id,
                                                        XComModel.task_id == "check_tables",
                                                        XComModel.key == "return_value")).all()
        runs.append({"state": str(dr.state),
                     "tasks": {f"{t.task_id}[{t.map_index}]": str(t.state) for t in tis},
                     "tries": {f"{t.task_id}[{t.map_index}]": t.try_number for t in tis},
                     "results": [_value(x) for x in sorted(xcoms, key=lambda x: x.map_index)],
                     "rows": fleet_status.load_rows()[0]})
    return {"runs": runs}


def watchers(asset_name: str) -> dict:
    from airflow.models.asset import AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        asset = session.scalar(select(AssetModel).where(AssetModel.name == asset_name))
        return {"uri": asset.uri if asset else None,
                "triggers": [{"classpath": t.classpath, "kwargs": t.kwargs} for t in (asset.triggers if asset else [])]}


def read(table: str) -> dict:
    from memwal.airflow import history

    return {"history": history.read(table, datetime(2000, 1, 1, tzinfo=UTC)),
            "alert_state": history.load_alert_state(table)}


def _register_lag_asset(table: str) -> None:
    """What the DAG processor does for a parsed DAG that references the lag asset."""
    from airflow.models.asset import AssetActive, AssetModel
    from airflow.utils.session import create_session

    from memwal.airflow.assets import lag_asset_name

    with create_session() as session:
        model = AssetModel(name=lag_asset_name(table), uri=f"memwal://{table}/lag", group="memwal")
        session.add(model)
        session.flush()
        session.add(AssetActive.for_asset(model))


def history_run(spec: dict) -> dict:
    from memwal.airflow import history

    table = spec["table"]
    before = history.read(table, datetime(2000, 1, 1, tzinfo=UTC))
    try:
        history.record(table, {"regions": []}, datetime.now(UTC))
        unregistered_error = None
    except history.HistoryError as exc:
        unregistered_error = str(exc)
    _register_lag_asset(table)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(spec["samples"]):
        history.record(table, {"unmerged_generations": i, "regions": [{"region_id": "r1", "unmerged_generations": i}]},
                       start + timedelta(minutes=spec["every_minutes"] * i),
                       retention_days=spec["retention_days"], max_samples=spec["max_samples"])
    from airflow.models.asset import AssetModel
    from airflow.models.asset_state_store import AssetStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    from memwal.airflow.assets import lag_asset_name

    with create_session() as session:
        keys = session.scalar(select(func.count()).select_from(AssetStateStoreModel).join(
            AssetModel, AssetModel.id == AssetStateStoreModel.asset_id).where(AssetModel.name == lag_asset_name(table)))
    return {"before": before, "unregistered_error": unregistered_error,
            "read": history.read(table, datetime(2000, 1, 1, tzinfo=UTC)),
            "read_since": history.read(table, start + timedelta(minutes=spec["every_minutes"] * spec["since_index"])),
            "state_store_rows": keys}


if __name__ == "__main__":
    mode, arg = sys.argv[1], sys.argv[2]
    out = {"read": read, "watchers": watchers, "monitor": lambda a: monitor(json.loads(a)),
           "history": lambda a: [history_run(spec) for spec in json.loads(a)]}[mode](arg)
    print("RESULT " + json.dumps(out, default=str))
