"""`make airflow`: a local Airflow with the demo table configured and written, until Ctrl-C.

Writes the demo table (`memwal.demo`, 4 regions with unmerged generations) at demo/table.lance unless it
exists, starts api-server, scheduler, dag-processor and triggerer through scripts/local_airflow.py
(PostgreSQL on 127.0.0.1:5432 when it answers, a fresh database; else SQLite), with the tables file
dags/memwal_tables.yaml and the `memwal_spark_local` Spark connection (local[*]) it names; unpauses
`memwal_merge` (the page's "Merge now") and `memwal_lag_monitor` (every minute here, so the page's lag chart
fills), prints the URL, the page and the logins, and stops every process it started on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_airflow import LocalAirflow, serve  # noqa: E402

DEMO_TABLE = REPO / "demo" / "table.lance"
UNPAUSE = ("memwal_merge", "memwal_lag_monitor")


def write_demo_table(path: Path, demo_args: list[str]) -> None:
    if path.exists():
        print(f"demo table: {path} (exists; `rm -rf {path.parent}` to write a fresh one)")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"demo table: writing {path} ...", flush=True)
    subprocess.run([sys.executable, "-m", "memwal.demo", "write", str(path), *demo_args], check=True,
                   stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make airflow", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=int(os.environ.get("AIRFLOW_PORT", "8080")))
    p.add_argument("--database", choices=["auto", "postgres", "sqlite"], default="auto")
    p.add_argument("--tables-file", default=str(REPO / "dags" / "memwal_tables.yaml"))
    p.add_argument("--demo-table", default=str(DEMO_TABLE), help="where the tables file's demo table lives")
    p.add_argument("--demo-base-rows", type=int, help="base rows of the demo table (memwal.demo's default)")
    p.add_argument("--demo-batches", type=int, help="write batches of the demo table (memwal.demo's default)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    demo_args = []
    if args.demo_base_rows:
        demo_args += ["--base-rows", str(args.demo_base_rows)]
    if args.demo_batches:
        demo_args += ["--batches", str(args.demo_batches), "--batch-rows", "400"]
    write_demo_table(Path(args.demo_table), demo_args)
    af = LocalAirflow(
        tables_file=args.tables_file, database=args.database, port=args.port,
        connections={"memwal_spark_local": {"conn_type": "spark", "host": "local[*]"}},
        env={"MEMWAL_LAG_MONITOR_SCHEDULE": "* * * * *"},
    )

    def unpause(af: LocalAirflow) -> list[str]:
        for dag_id in UNPAUSE:
            af.wait_for_dag(dag_id, timeout=180)
            af.set_paused(dag_id, False)
        return [f"MemWAL page: {af.url}/plugin/memwal  (MemWAL in the navigation)",
                "memwal_merge and memwal_lag_monitor are unpaused; the maintenance DAGs are paused."]

    return serve(af, "make airflow", unpause)


if __name__ == "__main__":
    sys.exit(main())
