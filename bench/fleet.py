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

- `--cycles SECONDS`: a real Airflow per mode and size running idle cycles (N idle tiny tables, copies of one;
  per-table DAGs on the tables file's `schedule`, the fleet DAG on $MEMWAL_FLEET_SCHEDULE, both `--every`,
  every minute by default; the mode's DAGs unpaused, the others paused as created) for SECONDS: the CPU
  seconds of the whole process tree (utime + stime + the reaped children's cutime + cstime of every live
  process of the deployment, so short-lived task processes count), per hour, the fleet / per-table ratio, and
  the runs and task instances created;
- `--latency SECONDS`: fleet mode with `--latency-tables` K tables, `memwal_fleet` triggered every `--interval`
  seconds through the REST API (a cron cannot go below a minute; no trigger while a run is active, as
  max_active_runs=1 would), a writer thread flushing `--flushes` generations into random tables at random
  times of the window (`--seed`): per flush, the seconds from the flush's return to the start_date of the
  first `maintain` task instance of that table that started after it; p50 / p95 / max.

    .venv/bin/python bench/fleet.py --sizes 10,100,1000 --repeat 3 --probe
    .venv/bin/python bench/fleet.py --sizes 10,30 --cycles 300 --no-parse
    .venv/bin/python bench/fleet.py --no-parse --latency 300 --latency-tables 10 --flushes 15
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
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


def _tree_cpu_ticks(pids: list[int]) -> int:
    """utime + stime + cutime + cstime of every live process in `pids`: with the reaped children counted by
    their parents (cutime/cstime), the CPU of the whole tree including short-lived task processes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _tree_pids(af) -> list[int]:
    """The deployment's processes: its components and all their descendants (by parent links: setproctitle
    overwrites the environment of the api-server and the LocalExecutor workers, so the marker misses them),
    and anything else carrying its marker."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [p.pid for p in af.procs.values()]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return sorted(found | set(af.descendants()))


def idle_tables(root: str, n: int) -> str:
    """n idle tiny MemWAL tables t0000.lance ... under `root` (one built, merged, snapshotted and GC'd, then
    copied); returns the region id they share."""
    from memwal.gc import gc_table
    from memwal.merge import merge_table
    from memwal.snapshot import refresh_snapshot

    from support.maintenance import build_table

    os.makedirs(root)
    first = os.path.join(root, "t0000.lance")
    region = build_table(_Loc(first), regions=1, generations=1)[0]
    merge_table(first)
    refresh_snapshot(first)
    gc_table(first)
    for i in range(1, n):
        shutil.copytree(first, os.path.join(root, f"t{i:04d}.lance"))
    return region


def _all_tis(af, dag_id: str, **params) -> list[dict]:
    """Every task instance of `dag_id` (pages of 100: the API's maximum page)."""
    out: list[dict] = []
    while True:
        page = af.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances",
                          params={"limit": 100, "offset": len(out), **params})
        out += page["task_instances"]
        if not page["task_instances"] or len(out) >= page["total_entries"]:
            return out


def _retry(call, tries: int = 5):
    """`call()`, again after a second when the API answers an error (SQLite's "database is locked": 500)."""
    for attempt in range(tries):
        try:
            return call()
        except Exception:
            if attempt == tries - 1:
                raise
            time.sleep(1)


def _total(af, path: str, **params) -> int:
    return af.request("GET", path, params={"limit": 1, **params})["total_entries"]


def _local_airflow(work: str, name: str, tables: dict, env: dict):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import yaml
    from local_airflow import LocalAirflow

    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"tables": tables}, f)
    return LocalAirflow(home=os.path.join(work, f"af-{name}"), tables_file=path, database="sqlite", pools={},
                        env=env)


def airflow_cycles(n: int, mode: str, work: str, window: float, every: str, baseline: float = 60.0) -> dict:
    """A real Airflow running idle cycles of this mode (N idle tables, every DAG of the mode unpaused on the
    cron `every`, the other DAGs paused as created) for `window` seconds: CPU seconds of the whole process
    tree (components, LocalExecutor workers, task runners and task processes) and the runs / task instances
    created in the window; first, over `baseline` seconds, the same deployment's CPU with every DAG paused."""
    root = os.path.join(work, f"lake-{mode}-{n}")
    idle_tables(root, n)
    if mode == "fleet":
        tables = {"lake": {"root": root, "engine": "in_process"}}
        dag_ids = ["memwal_fleet"]  # memwal_fleet_maintain is unpaused at creation (runs only when triggered)
    else:
        tables = {f"t{i:04d}": {"uri": os.path.join(root, f"t{i:04d}.lance"), "engine": "in_process",
                                "schedule": every} for i in range(n)}
        dag_ids = [f"memwal_maintenance__t{i:04d}" for i in range(n)]
    af = _local_airflow(work, f"cycles-{mode}-{n}", tables, {"MEMWAL_FLEET_SCHEDULE": every})
    life0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    af.start()
    try:
        for dag_id in dag_ids:
            af.wait_for_dag(dag_id, timeout=600)
        time.sleep(20)  # the first parse's aftermath (serialization) settles, as for the paused figure
        tick = os.sysconf("SC_CLK_TCK")
        # The same deployment paused first: its fixed cost (components, re-parsing), the same in both modes.
        b0, tb = _tree_cpu_ticks(_tree_pids(af)), time.monotonic()
        time.sleep(baseline)
        base = (_tree_cpu_ticks(_tree_pids(af)) - b0) / tick / (time.monotonic() - tb)
        runs0 = _total(af, "/api/v2/dags/~/dagRuns")
        tis0 = _total(af, "/api/v2/dags/~/dagRuns/~/taskInstances")
        c0, t0 = _tree_cpu_ticks(_tree_pids(af)), time.monotonic()
        for dag_id in dag_ids:
            _retry(lambda d=dag_id: af.set_paused(d, False))
        time.sleep(max(0.0, window - (time.monotonic() - t0)))
        cpu = (_tree_cpu_ticks(_tree_pids(af)) - c0) / tick
        wall = time.monotonic() - t0
        runs = _total(af, "/api/v2/dags/~/dagRuns") - runs0
        tis = _total(af, "/api/v2/dags/~/dagRuns/~/taskInstances") - tis0
        done = _total(af, "/api/v2/dags/~/dagRuns/~/taskInstances", state=["success", "skipped"])
        maintain = _total(af, "/api/v2/dags/memwal_fleet_maintain/dagRuns")
        tree_life = _tree_cpu_ticks(_tree_pids(af)) / tick
    finally:
        af.stop()
    life1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Cross-check of the tree's accounting: the kernel's total of the reaped components (start to stop,
    # `airflow db migrate` included) against the tree's own total just before stop.
    reaped = life1.ru_utime - life0.ru_utime + life1.ru_stime - life0.ru_stime
    return {"mode": mode, "tables": n, "window_s": round(wall), "cpu_s": round(cpu, 1),
            "cpu_s_per_hour": round(cpu * 3600 / wall), "paused_cpu_s_per_hour": round(base * 3600),
            "cycles_cpu_s_per_hour": round((cpu - base * wall) * 3600 / wall), "runs": runs, "task_instances": tis,
            "tis_success_or_skipped": done, "fleet_maintain_runs": maintain,
            "check_tree_life_cpu_s": round(tree_life, 1), "check_reaped_life_cpu_s": round(reaped, 1),
            "load_avg": os.getloadavg()}


def _utc(ts: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def merge_latency(k: int, window: float, interval: float, flushes: int, seed: int, work: str,
                  drain: float = 180.0) -> dict:
    """The fleet DAG triggered every `interval` s through the REST API (its cron cannot go below a minute), K
    idle tables under one root, and a writer (a thread here) flushing `flushes` generations, each into a
    random table at a random time of the window (seeded). Per flush: from the flush's return to the start of
    the first `maintain` task instance of that table that started after it (its start_date)."""
    import random
    import threading

    from support.maintenance import flush_generation
    from support.tables import rows

    root = os.path.join(work, f"lake-latency-{k}")
    region = idle_tables(root, k)
    rng = random.Random(seed)
    plan = sorted((rng.uniform(5, window - 5), rng.randrange(k)) for _ in range(flushes))
    af = _local_airflow(work, f"latency-{k}", {"lake": {"root": root, "engine": "in_process"}},
                        {"MEMWAL_FLEET_SCHEDULE": "none"})
    flushed: list[tuple[float, str]] = []
    errors: list[BaseException] = []

    def writer(start: float) -> None:
        try:
            for i, (at, t) in enumerate(plan):
                time.sleep(max(0.0, start + at - time.monotonic()))
                flush_generation(_Loc(os.path.join(root, f"t{t:04d}.lance")), region,
                                 rows([5000 + i], f"w{i}"))
                flushed.append((time.time(), f"lake.t{t:04d}"))
        except BaseException as exc:  # reported after the window
            errors.append(exc)

    af.start()
    try:
        af.wait_for_dag("memwal_fleet", timeout=600)
        af.wait_for_dag("memwal_fleet_maintain", timeout=600)
        af.set_paused("memwal_fleet", False)
        start = time.monotonic()
        thread = threading.Thread(target=writer, args=(start,), daemon=True)
        thread.start()
        triggered = skipped = 0
        last_run = None
        while time.monotonic() - start < window + drain:
            tick = time.monotonic()
            if last_run and af.dag_run("memwal_fleet", last_run)["state"] not in ("success", "failed"):
                skipped += 1  # as a schedule with max_active_runs=1 would: no run while one is active
            else:
                last_run = af.trigger_dag("memwal_fleet", unpause=False)
                triggered += 1
            if time.monotonic() - start > window and not thread.is_alive() and _all_merged(af, flushed):
                break
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
        thread.join(timeout=60)
        tis = _all_tis(af, "memwal_fleet_maintain", task_id="maintain")
        probes = _all_tis(af, "memwal_fleet")
    finally:
        af.stop()
    if errors:
        raise RuntimeError(f"the writer failed: {errors[0]!r}")
    starts: dict[str, list[float]] = {}
    for ti in tis:
        if ti.get("start_date"):
            starts.setdefault(ti.get("rendered_map_index") or "", []).append(_utc(ti["start_date"]))
    lat = []
    for at, table in flushed:
        after = [s for s in starts.get(table, []) if s >= at]
        if after:
            lat.append(min(after) - at)
    probe_s = [_utc(p["end_date"]) - _utc(p["start_date"]) for p in probes if p.get("end_date")]
    q = statistics.quantiles(lat, n=20, method="inclusive") if len(lat) > 1 else lat * 19
    return {"tables": k, "interval_s": interval, "window_s": window, "flushes": len(flushed),
            "measured": len(lat), "p50_s": round(statistics.median(lat), 1) if lat else None,
            "p95_s": round(q[18], 1) if lat else None, "max_s": round(max(lat), 1) if lat else None,
            "probe_runs_triggered": triggered, "triggers_skipped_busy": skipped,
            "probe_wall_s_median": round(statistics.median(probe_s), 1) if probe_s else None,
            "maintain_tis": len(tis), "load_avg": os.getloadavg()}


def _all_merged(af, flushed: list[tuple[float, str]]) -> bool:
    """Every flush so far has a maintain task instance of its table started after it."""
    tis = _all_tis(af, "memwal_fleet_maintain", task_id="maintain")
    starts: dict[str, float] = {}
    for ti in tis:
        if ti.get("start_date"):
            name = ti.get("rendered_map_index") or ""
            starts[name] = max(starts.get(name, 0.0), _utc(ti["start_date"]))
    return all(starts.get(table, 0.0) >= at for at, table in flushed)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--probe", action="store_true", help="also time an idle fleet cycle's probe")
    ap.add_argument("--airflow", type=float, default=0.0, metavar="SECONDS",
                    help="also measure a paused real Airflow's CPU over SECONDS per mode and size")
    ap.add_argument("--cycles", type=float, default=0.0, metavar="SECONDS",
                    help="a real Airflow running idle cycles per mode and size for SECONDS: its whole CPU")
    ap.add_argument("--every", default="* * * * *", help="the cron of both modes' idle cycles (--cycles)")
    ap.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                    help="flush-to-merge-start latency over a writer's window of SECONDS (fleet mode)")
    ap.add_argument("--latency-tables", type=int, default=10)
    ap.add_argument("--interval", type=float, default=30.0, help="the probe's interval (--latency)")
    ap.add_argument("--flushes", type=int, default=20, help="generations the writer flushes (--latency)")
    ap.add_argument("--seed", type=int, default=43)
    ap.add_argument("--no-parse", action="store_true", help="skip the parse / task-instance figures")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # a kill stops the Airflow started here (finally: af.stop())
    signal.signal(signal.SIGINT, _interrupt)  # also when started in the background (SIGINT inherited ignored)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as work:
        home = os.path.join(work, "airflow")
        os.makedirs(home)
        for n in sizes if args.cycles else []:
            row = {"tables": n, "load_avg_before": os.getloadavg()}
            for mode in ("per_table", "fleet"):
                row[mode] = airflow_cycles(n, mode, work, args.cycles, args.every)
                print(json.dumps(row[mode]), flush=True)
            row["cpu_ratio_fleet_per_table"] = round(row["fleet"]["cpu_s"] / row["per_table"]["cpu_s"], 3)
            row["cycles_cpu_ratio"] = round(row["fleet"]["cycles_cpu_s_per_hour"]
                                            / max(1, row["per_table"]["cycles_cpu_s_per_hour"]), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.latency:
            row = merge_latency(args.latency_tables, args.latency, args.interval, args.flushes, args.seed, work)
            rows.append({"latency": row})
            print(json.dumps(row), flush=True)
        for n in [] if args.no_parse else sizes:
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
