"""What one DAG run adds to Airflow's metadata DB: rows and bytes per metadata table, measured on a scratch
SQLite Airflow home (`airflow db migrate`, then `dag.test()` of the DAG RUNS times over TABLES small MemWAL
tables written by `memwal.demo`). The figures behind docs/airflow.md "What the metadata database grows by".

    python scripts/metadata_db_growth.py DAG_FILE DAG_ID [--tables 3] [--runs 2] [--fleet]

--fleet marks the tables `fleet: true` (the fleet DAG's tables; its probe run triggers maintenance runs,
which `dag.test()` leaves queued: measure their task instances separately).

DAG_FILE is copied alone into the scratch DAGs folder (so an older version of a DAG file can be measured:
`git show REV:dags/memwal_lag_monitor.py > /tmp/old/memwal_lag_monitor.py`). Prints one JSON line: per
metadata table, rows and payload bytes (SQLite's dbstat, indexes included) added per run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import json, os, sys
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags[sys.argv[1]]
states = [str(dag.test().state) for _ in range(int(sys.argv[2]))]
print("STATES " + json.dumps(states))
"""


def _sizes(db: Path) -> dict[str, tuple[int, int]]:
    """table -> (rows, payload bytes of the table and its indexes)."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_schema where type='table'")]
        owner = dict(con.execute("select name, tbl_name from sqlite_schema where type in ('table','index')"))
        payload: dict[str, int] = {}
        for name, size in con.execute("select name, sum(payload) from dbstat group by name"):
            table = owner.get(name, name)
            payload[table] = payload.get(table, 0) + (size or 0)
        return {t: (con.execute(f'select count(*) from "{t}"').fetchone()[0], payload.get(t, 0)) for t in tables}
    finally:
        con.close()


def measure(dag_file: Path, dag_id: str, tables: int, runs: int, fleet: bool = False) -> dict:
    home = Path(tempfile.mkdtemp(prefix="memwal-dbgrowth-"))
    try:
        dags = home / "dags"
        dags.mkdir()
        shutil.copy(dag_file, dags / dag_file.name)
        if fleet:  # the fleet DAG reads the tables file at run time only
            (home / "plugins").mkdir(exist_ok=True)
        entries = {}
        for i in range(tables):
            uri = home / f"t{i}.lance"
            subprocess.run([sys.executable, "-m", "memwal.demo", "write", str(uri), "--base-rows", "200",
                            "--batches", "1", "--batch-rows", "50"], check=True, capture_output=True)
            entries[f"t{i}"] = {"uri": str(uri), "engine": "in_process", "schedule": "@hourly", "fleet": fleet}
        (dags / "memwal_tables.yaml").write_text(json.dumps({"tables": entries}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
                    "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                    "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
                    "MEMWAL_TABLES_FILE": str(dags / "memwal_tables.yaml")})
        subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=env, check=True,
                       capture_output=True, timeout=600)
        # one run first: the DAG's own rows (dag, serialized_dag, assets) are not per-run growth
        subprocess.run([sys.executable, "-c", _CHILD, dag_id, "1"], env=env, check=True, capture_output=True,
                       timeout=1800, cwd=str(REPO))
        before = _sizes(home / "airflow.db")
        proc = subprocess.run([sys.executable, "-c", _CHILD, dag_id, str(runs)], env=env, capture_output=True,
                              text=True, timeout=1800, cwd=str(REPO))
        states = next((json.loads(ln[7:]) for ln in proc.stdout.splitlines() if ln.startswith("STATES ")), None)
        if states is None:
            raise SystemExit(f"dag.test() of {dag_id} failed:\n{proc.stderr[-3000:]}")
        after = _sizes(home / "airflow.db")
        grown = {t: {"rows": (after[t][0] - before.get(t, (0, 0))[0]) / runs,
                     "bytes": (after[t][1] - before.get(t, (0, 0))[1]) / runs}
                 for t in after if after[t] != before.get(t)}
        return {"dag_id": dag_id, "tables": tables, "runs": runs, "states": states, "per_run": grown}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dag_file", type=Path)
    parser.add_argument("dag_id")
    parser.add_argument("--tables", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--fleet", action="store_true")
    args = parser.parse_args()
    print(json.dumps(measure(args.dag_file.resolve(), args.dag_id, args.tables, args.runs, args.fleet)))


if __name__ == "__main__":
    main()
