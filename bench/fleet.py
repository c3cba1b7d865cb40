"""Fleet mode against per-table DAGs (issue 43, item 2): what each costs Airflow as the fleet grows.

Per size N of `--sizes` (a tables file of N tables; the DAG files do no I/O, so the tables need not exist):
- the task runner's parse: a fresh process doing what Airflow 3's task runner does before every task
  (`BundleDagBag(dag_folder=<the task's DAG file>)`), for `dags/memwal_maintenance.py` (per-table mode) and
  `dags/memwal_fleet.py` (fleet mode, the same tables as one root); CPU seconds of that process (median of
  `--repeat`), and the DAGs / tasks the file builds;
- task instances per cycle with nothing due: per-table mode, the task instances of one maintenance run of an
  idle table (from the DAG: every task, the mapped merge as one skipped instance) times N; fleet mode, the
  fleet DAG's tasks (the probe alone: the maintenance DAG runs only when something is due);
- `--airflow SECONDS`: a real Airflow (scripts/local_airflow.py, SQLite, Airflow's default 30 s re-parse of an
  unchanged file) per mode and size, every DAG paused (what the DAG set costs before any run): CPU seconds
  of all its processes over SECONDS once the DAGs are loaded;
- `--probe`: one idle fleet cycle's probe in this process: `probe_tables` over N idle tiny local tables under
  one root (copies by hard links), warm (the states of a first sweep), CPU and wall seconds.

    .venv/bin/python bench/fleet.py --sizes 10,100,1000 --repeat 3 --probe
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, os.path.join(REPO, "tests"))

_PARSE = """
import json, sys
from airflow.dag_processing.dagbag import BundleDagBag
bag = BundleDagBag(dag_folder=sys.argv[1], safe_mode=False, load_op_links=False, bundle_path=sys.argv[2],
                   bundle_name="dags-folder")
assert not bag.import_errors, bag.import_errors
print(json.dumps({"dags": len(bag.dags), "tasks": sum(len(d.tasks) for d in bag.dags.values()),
                  "task_ids": {d: [t.task_id for t in dag.tasks] for d, dag in list(bag.dags.items())[:2]}}))
"""


def tables_file(path: str, n: int, mode: str) -> str:
    import yaml

    if mode == "fleet":
        tables = {"lake": {"root": "/data/lake", "engine": "in_process"}}
    else:
        tables = {f"t{i:04d}": {"uri": f"/data/lake/t{i:04d}.lance", "engine": "in_process"} for i in range(n)}
    with open(path, "w") as f:
        yaml.safe_dump({"tables": tables}, f)
    return path


def parse_cost(dag_file: str, tables: str, home: str, repeat: int) -> dict:
    """CPU seconds of a fresh process parsing `dag_file` as the task runner does (median), and what it built."""
    env = {**os.environ, "MEMWAL_TABLES_FILE": tables, "AIRFLOW_HOME": home,
           "PYTHONPATH": os.path.join(REPO, "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    cpu, out = [], {}
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-c", _PARSE, dag_file, os.path.join(REPO, "dags")], env=env,
                              capture_output=True, text=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            raise RuntimeError(f"parsing {dag_file}: {done.stderr[-2000:]}")
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out = json.loads(done.stdout.strip().splitlines()[-1])
    return {"cpu_s": round(statistics.median(cpu), 2), "dags": out["dags"], "tasks": out["tasks"],
            "task_ids": out["task_ids"]}


class _Loc:
    def __init__(self, uri: str):
        self.kind, self.uri, self.storage_options = "local", uri, None


def probe_cycle(n: int, workdir: str) -> dict:
    """A warm probe of n idle tiny tables under one root (what an idle fleet cycle's probe does)."""
    from memwal.gc import gc_table
    from memwal.merge import merge_table
    from memwal.probe import ProbeEntry, next_states, probe_tables
    from memwal.snapshot import refresh_snapshot

    from support.maintenance import build_table

    root = os.path.join(workdir, f"root{n}")
    os.makedirs(root)
    first = os.path.join(root, "t0000.lance")
    build_table(_Loc(first), regions=1, generations=1)
    merge_table(first)
    refresh_snapshot(first)
    gc_table(first)
    for i in range(1, n):
        shutil.copytree(first, os.path.join(root, f"t{i:04d}.lance"), copy_function=os.link)
    entry = [ProbeEntry(root, kind="root")]
    states = next_states(probe_tables(entry))
    t0, c0 = time.monotonic(), time.process_time()
    results = probe_tables(entry, states)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    due = sum(bool(r.due) for r in results)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "tables": len(results), "due": due}


def _cpu_ticks(pids: list[int]) -> dict[int, int]:
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = int(fields[11]) + int(fields[12])  # utime + stime (of this process, not its children)
        except (OSError, IndexError, ValueError):
            continue
    return out


def airflow_idle_cpu(n: int, mode: str, work: str, seconds: float) -> dict:
    """CPU seconds of a paused Airflow's processes over `seconds` with the DAG set of this mode and size."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from local_airflow import LocalAirflow

    tables = tables_file(os.path.join(work, f"af-{mode}-{n}.yaml"), n, mode)
    af = LocalAirflow(home=os.path.join(work, f"af-{mode}-{n}"), tables_file=tables, database="sqlite", pools={})
    t0 = time.monotonic()
    af.start()
    try:
        af.wait_for_dag("memwal_fleet" if mode == "fleet" else f"memwal_maintenance__t{n - 1:04d}", timeout=600)
        loaded = time.monotonic() - t0
        time.sleep(30)  # the first parse's aftermath (serialization) settles
        tick = os.sysconf("SC_CLK_TCK")
        before = _cpu_ticks(af.descendants())
        time.sleep(seconds)
        after = _cpu_ticks(af.descendants())
        cpu = sum(t - before.get(pid, 0) for pid, t in after.items()) / tick
        dags = af.request("GET", "/api/v2/dags", params={"limit": 1})["total_entries"]
    finally:
        af.stop()
    return {"cpu_s": round(cpu, 1), "cpu_s_per_min": round(cpu * 60 / seconds, 1), "dags": dags,
            "loaded_after_s": round(loaded, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--probe", action="store_true", help="also time an idle fleet cycle's probe")
    ap.add_argument("--airflow", type=float, default=0.0, metavar="SECONDS",
                    help="also measure a paused real Airflow's CPU over SECONDS per mode and size")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as work:
        home = os.path.join(work, "airflow")
        os.makedirs(home)
        for n in sizes:
            per_table = parse_cost(os.path.join(REPO, "dags", "memwal_maintenance.py"),
                                   tables_file(os.path.join(work, f"t{n}.yaml"), n, "per_table"), home, args.repeat)
            fleet = parse_cost(os.path.join(REPO, "dags", "memwal_fleet.py"),
                               tables_file(os.path.join(work, f"f{n}.yaml"), n, "fleet"), home, args.repeat)
            one_run = len(next(iter(per_table["task_ids"].values())))
            fleet_tis = len(fleet["task_ids"]["memwal_fleet"])
            row = {"tables": n, "per_table_parse_cpu_s": per_table["cpu_s"], "per_table_dags": per_table["dags"],
                   "per_table_tasks": per_table["tasks"], "fleet_parse_cpu_s": fleet["cpu_s"],
                   "fleet_dags": fleet["dags"], "fleet_tasks": fleet["tasks"],
                   "idle_tis_per_cycle_per_table": one_run * n, "idle_tis_per_cycle_fleet": fleet_tis}
            if args.probe:
                row["probe"] = probe_cycle(n, work)
            if args.airflow:
                row["airflow_idle"] = {mode: airflow_idle_cpu(n, mode, work, args.airflow)
                                       for mode in ("per_table", "fleet")}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
