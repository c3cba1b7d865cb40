"""Run one DAG with `dag.test()` in this process and print what happened as one JSON line (last stdout line).

    python tests/airflow/dag_runner.py DAG_ID [RUN_CONF_JSON]
    python tests/airflow/dag_runner.py --runs '[["DAG_ID", {conf} or null], ...]'   (one after the other;
                                                                                    prints a JSON list)

The caller sets the environment (AIRFLOW_HOME with a migrated SQLite DB, AIRFLOW__CORE__DAGS_FOLDER,
MEMWAL_TABLES_FILE, AIRFLOW_CONN_*); a separate process keeps Airflow's settings out of the test process.
Output: {"state", "run_id", "tasks": [{task_id, map_index, state, rendered_map_index}], "xcoms":
[{task_id, map_index, key, value}], "asset_events": [{asset, extra, source_task_id, source_map_index}]}.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    if sys.argv[1] == "--runs":
        runs = json.loads(sys.argv[2])
    else:
        runs = [[sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None]]
    from airflow.models.pool import Pool

    Pool.create_or_update_pool("memwal_spark", 2, "MemWAL Spark applications", include_deferred=False)
    reports = [run_one(dag_id, conf) for dag_id, conf in runs]
    sys.stdout.flush()
    print(json.dumps(reports if sys.argv[1] == "--runs" else reports[0], default=str))
    return 0


def run_one(dag_id: str, conf: dict | None) -> dict:
    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    folder = os.environ["AIRFLOW__CORE__DAGS_FOLDER"]
    name = "memwal_maintenance.py" if dag_id.startswith("memwal_maintenance__") else f"{dag_id}.py"
    bag = DagBag(os.path.join(folder, name) if os.path.exists(os.path.join(folder, name)) else folder)
    dag = bag.dags.get(dag_id)
    if dag is None:
        return {"error": f"no DAG {dag_id}", "import_errors": bag.import_errors}
    dr = dag.test(run_conf=conf)
    session = settings.Session()
    tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag_id,
                                                     TaskInstance.run_id == dr.run_id)).all()
    xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == dr.run_id)).all()
    events = session.execute(
        select(AssetEvent, AssetModel.name).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(
            AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == dr.run_id)
    ).all()
    return {
        "state": str(dr.state),
        "run_id": dr.run_id,
        "tasks": [{"task_id": t.task_id, "map_index": t.map_index, "state": str(t.state),
                   "rendered_map_index": t.rendered_map_index} for t in tis],
        "xcoms": [{"task_id": x.task_id, "map_index": x.map_index, "key": x.key,
                   "value": XComModel.deserialize_value(x)} for x in xcoms],
        "asset_events": [{"asset": name, "extra": e.extra, "source_task_id": e.source_task_id,
                          "source_map_index": e.source_map_index} for e, name in events],
    }


if __name__ == "__main__":
    sys.exit(main())
