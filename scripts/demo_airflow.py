"""`make demo`, the Airflow part: more writes arrive on the demo table, then Airflow runs the table's
maintenance DAG on embedded defaults (an Airflow home with SQLite under demo/airflow, a local Spark Connect
server for the table's `spark_connect` engine through the `memwal_spark_connect_local` connection, started
here and stopped at the end; Spark local[*] through `memwal_spark_local` for a table on engine spark; local
files).

    python scripts/demo_airflow.py write-more TABLE   two more batches through the writer (TABLE.model.json updated)
    python scripts/demo_airflow.py maintain           memwal_maintenance__demo with dag.test(); prints each
                                                      task's outcome and the merge summaries
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / "demo" / "airflow"
DAG_ID = "memwal_maintenance__demo"


def write_more(table: str, batches: int = 2, batch_rows: int = 1_000, seed: int = 11) -> None:
    import numpy as np

    from memwal.demo import model_path, write_batches

    path = Path(model_path(table))
    model = {int(k): v for k, v in json.loads(path.read_text()).items()}
    write_batches(table, model, np.random.default_rng(seed), batches, batch_rows, first_version=100, id_space=40_000)
    path.write_text(json.dumps(model))


def airflow_env(connect_port: int | None = None) -> dict[str, str]:
    HOME.mkdir(parents=True, exist_ok=True)
    (HOME / "plugins").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(HOME),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{HOME}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(HOME / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        # The demo table's Spark connection (dags/memwal_tables.yaml): Spark local[*] on this machine.
        "AIRFLOW_CONN_MEMWAL_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    })
    if connect_port:  # the demo table's engine (dags/memwal_tables.yaml): the local Spark Connect server
        env["AIRFLOW_CONN_MEMWAL_SPARK_CONNECT_LOCAL"] = json.dumps(
            {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_port})
    return env


def maintain() -> int:
    sys.path.insert(0, str(REPO / "scripts"))
    from ports import free_port

    from spark_jobs.connect_server import ConnectServer

    print("demo: starting a local Spark Connect server (127.0.0.1, the demo table's engine spark_connect)")
    with ConnectServer(master="local[*]", port=free_port()) as server:
        print(f"demo: Spark Connect server at {server.url}")
        return _maintain(airflow_env(server.port))


def _maintain(env: dict[str, str]) -> int:
    airflow = str(Path(sys.executable).with_name("airflow"))
    print(f"demo: Airflow home {HOME} (SQLite); airflow db migrate")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    print(f"demo: dag.test() of {DAG_ID} (merge in region batches, index catch-up, compaction, retention, "
          "snapshot refresh, GC)")
    proc = subprocess.run([sys.executable, __file__, "_run"], env=env, capture_output=True, text=True)
    (HOME / "dag_test.log").write_text(proc.stdout + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        print(proc.stderr[-3000:], file=sys.stderr)
        print(f"demo: the DAG run gave no report (log: {HOME / 'dag_test.log'})", file=sys.stderr)
        return 1
    report = json.loads(lines[-1])
    for t in report["tasks"]:
        label = f" [{t['label']}]" if t.get("label") else ""
        print(f"   {t['task_id']:<22}{'#' + str(t['map_index']) if t['map_index'] >= 0 else '':<4}{t['state']}{label}")
    for s in report["merges"]:
        where = s.get("spark_connect_url") or s.get("spark_master") or "this process"
        print(f"   merge: {s['generations_merged']} generations, {s['rows_upserted']} rows upserted, "
              f"{s['rows_deleted']} deleted, {s['commits']} commits, ran on {s.get('ran_on')} ({where}): "
              f"{s.get('engine_reason')}")
    for s in report["upkeep"]:
        if s.get("job") == "compaction":
            print(f"   compaction: {'; '.join(s.get('due') or []) or 'not due'}, fragments "
                  f"{s.get('health_before', {}).get('fragments')} -> {s.get('health_after', {}).get('fragments')}")
        elif s.get("job") == "retention":
            print(f"   retention: {s['num_versions_removed']} table versions removed ({s['bytes_removed']} bytes), "
                  f"oldest retained {s['oldest_retained_version']}")
        elif s.get("job") == "gc":
            print(f"   gc: deleted {s['deleted']} ({s['bytes']} bytes)")
        if s.get("ran_on"):
            print(f"      ran on {s['ran_on']}: {s.get('engine_reason')}")
    print(f"demo: DAG run {report['state']} (full log: {HOME / 'dag_test.log'})")
    return 0 if report["state"] == "success" else 1


def _run() -> int:
    """In the Airflow environment: the pool, then dag.test(); one JSON line with what happened."""
    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    Pool.create_or_update_pool("memwal_spark", 2, "MemWAL Spark applications", include_deferred=False)
    dag = DagBag(str(REPO / "dags")).dags[DAG_ID]
    dr = dag.test()
    session = settings.Session()
    tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == DAG_ID,
                                                     TaskInstance.run_id == dr.run_id)).all()
    merges = session.scalars(select(XComModel).where(XComModel.dag_id == DAG_ID, XComModel.run_id == dr.run_id,
                                                     XComModel.task_id == "merge",
                                                     XComModel.key == "return_value")).all()
    upkeep = {t: XComModel.deserialize_value(x) for t in ("compaction", "retention", "gc")
              for x in session.scalars(select(XComModel).where(
                  XComModel.dag_id == DAG_ID, XComModel.run_id == dr.run_id, XComModel.task_id == t,
                  XComModel.key == "return_value")).all()}
    order = {"find_pending_regions": 0, "merge": 1, "index_catchup": 2, "compaction": 3, "retention": 4,
             "snapshot_refresh": 5, "gc": 6}
    print(json.dumps({
        "state": str(dr.state),
        "tasks": [{"task_id": t.task_id, "map_index": t.map_index, "state": str(t.state),
                   "label": t.rendered_map_index} for t in sorted(tis, key=lambda t: (order.get(t.task_id, 9),
                                                                                      t.map_index))],
        "merges": [XComModel.deserialize_value(x) for x in sorted(merges, key=lambda x: x.map_index)],
        "upkeep": list(upkeep.values()),
    }, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/demo_airflow.py")
    p.add_argument("action", choices=["write-more", "maintain", "_run"])
    p.add_argument("table", nargs="?")
    args = p.parse_args(argv)
    if args.action == "write-more":
        write_more(args.table)
        return 0
    if args.action == "maintain":
        return maintain()
    return _run()


if __name__ == "__main__":
    sys.exit(main())
