"""Engines benchmark (issue 25): what a job costs on each engine, as an Airflow task runs it.

Every job runs as `memwal <job> TABLE --json` in a fresh Python process (an Airflow task is one), on:
- in_process: no flag;
- spark: `--spark --master local[2]` (spark-submit: one Spark application per job with executor work);
- spark_connect: `--spark-connect URL` (the driver logic in the task process, executor work on one
  long-lived local Spark Connect server started here, `local[2]`);
- auto: `--spark-connect URL --auto` (in process under the thresholds of `memwal.engines.AutoThresholds`).

Parts (each table is a copy of one template, so every engine starts from the same bytes; the template's
regions are its region spec's, bucket(id, --regions), written through TableWriter, so each key lives in one
region: were one key in two regions, its newest version would follow merge order, which differs by engine):
1. per-job overhead: wall time of the task process minus the job's own `duration_s`, for each job of the
   maintenance DAG (merge, catchup, compaction --force, retention, snapshot, gc);
2. one small table's whole maintenance run (those jobs in order) on every engine: wall seconds, and the
   base table after it (must be identical on every engine);
3. a fleet: N tables' maintenance cycle (default 20), two tasks at a time, spark against spark_connect:
   wall seconds and CPU seconds (this process's children, spark-submit's JVMs and their Python workers
   included, plus the Connect server's processes, read from /proc);
4. freshness: a generation is flushed (in each region), a merge task starts at once (as event-driven
   maintenance starts one); seconds until it is merged, p50 over `--runs`, per engine;
5. auto's merge threshold: a merge of growing backlogs (`--crossover-rows`) in process against spark_connect,
   and the smallest backlog (bytes) where spark_connect is faster, if any.

Task processes find the project's bytecode compiled (`PYTHONPYCACHEPREFIX` under the bench's directory, as an
installed package has it: without it, as under PYTHONDONTWRITEBYTECODE, every task compiles some 50 of our
modules, 0.1-0.15 s); `--no-bytecode` runs them without. `--baseline-root DIR` (a checkout of other code, e.g.
a `git worktree` of the commit before) runs part 1 on it too, alternating with this checkout in every round,
and prints the ratios.

Targets: per-job overhead on spark_connect <= 1.0 s (issue 44; 1.5 s before); the small table's run >= 4x
faster on spark_connect than on spark; the fleet's CPU seconds >= 4x lower; results identical on every engine.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO), str(REPO / "scripts")]

import lance  # noqa: E402
import pyarrow as pa  # noqa: E402

from memwal.table_writer import TableWriter  # noqa: E402
from memwal.writer import WriterConfig  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("name", pa.string()),
                    pa.field("score", pa.float64())])
JOBS = (("merge", []), ("catchup", []), ("compaction", ["--force"]), ("retention", []), ("snapshot", []),
        ("gc", []))
ENGINES = ("in_process", "spark", "spark_connect", "auto")
ONE_GEN = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _rows(ids, tag: str) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [i / 2 for i in ids]}, schema=SCHEMA)


def build(path: str, base_rows: int, regions: int, generations: int, gen_rows: int) -> None:
    """Base rows, MemWAL with bucket(id, regions), then `generations` generations in every region of about
    gen_rows rows each (every generation updates half of the keys of the one before it, and base rows)."""
    lance.write_dataset(_rows(range(base_rows), "base"), path)
    ds = lance.dataset(path)
    ds.initialize_mem_wal(bucket_column="id", num_buckets=regions)
    lance.dataset(path).create_scalar_index("name", "BTREE", name="name_idx")
    with TableWriter(path, config=ONE_GEN) as w:
        for g in range(generations):
            start = base_rows // 2 + g * regions * gen_rows // 2
            w.put(_rows(range(start, start + regions * gen_rows), f"g{g}-"))
            w.flush()


def flush_one(path: str, rows: int, tag: str) -> None:
    """One more generation of `rows` keys (in each region they fall in)."""
    with TableWriter(path, config=ONE_GEN) as w:
        w.put(_rows(range(10**6, 10**6 + rows), tag))
        w.flush()


def engine_args(engine: str, url: str | None) -> list[str]:
    return {"in_process": [], "spark": ["--spark", "--master", "local[2]", "--conf",
                                        f"spark.driver.extraJavaOptions={FAST_JVM}"],
            "spark_connect": ["--spark-connect", str(url)],
            "auto": ["--spark-connect", str(url), "--auto"]}[engine]


# The task processes' environment beyond PYTHONPATH (main() sets the bytecode cache here).
TASK_ENV: dict[str, str | None] = {}


def run_job(job: str, extra: list[str], table: str, engine: str, url: str | None, root: Path = REPO) -> dict:
    """One task: a fresh process running the job (the code of checkout `root`). Its wall time, summary and
    overhead (wall - duration_s)."""
    cmd = [sys.executable, "-m", "memwal.cli", job, table, *extra, *engine_args(engine, url), "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "plugins"), str(root)]), **TASK_ENV}
    env = {k: v for k, v in env.items() if v is not None}
    started, cpu0 = time.monotonic(), children_cpu_s()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    wall, cpu = time.monotonic() - started, children_cpu_s() - cpu0  # cpu: exact only when tasks run one at a time
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"job": job, "engine": engine, "wall_s": wall, "cpu_s": cpu,
            "duration_s": float(summary.get("duration_s") or 0),
            "overhead_s": wall - float(summary.get("duration_s") or 0), "ran_on": summary.get("ran_on"),
            "engine_reason": summary.get("engine_reason")}


def maintenance(table: str, engine: str, url: str | None, root: Path = REPO) -> list[dict]:
    return [run_job(job, extra, table, engine, url, root) for job, extra in JOBS]


def base_rows(table: str) -> list:
    t = lance.dataset(table).to_table(columns=["id", "name", "score"]).sort_by("id")
    return t.to_pylist()


def proc_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes in a process group (the Connect server's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # pgrp
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
    return total


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fleet", type=int, default=20, help="tables in the fleet part (default 20)")
    p.add_argument("--runs", type=int, default=3, help="freshness runs per engine (p50)")
    p.add_argument("--base-rows", type=int, default=20_000)
    p.add_argument("--regions", type=int, default=2)
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--gen-rows", type=int, default=2_000)
    p.add_argument("--crossover-rows", default="20000,100000,400000",
                   help="rows per region of the backlogs of part 5 (comma-separated)")
    p.add_argument("--skip", action="append", default=[],
                   choices=["overhead", "small", "fleet", "freshness", "crossover"])
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="engines of part 1, comma-separated (default all; e.g. in_process,spark_connect)")
    p.add_argument("--repeat", type=int, default=1,
                   help="part 1: runs of each job per engine (a fresh table copy each), the median reported")
    p.add_argument("--baseline-root", type=Path, default=None,
                   help="part 1 also on this checkout's code (e.g. a worktree of the commit before), alternated")
    p.add_argument("--no-bytecode", action="store_true",
                   help="task processes without compiled bytecode of our modules (PYTHONDONTWRITEBYTECODE)")
    args = p.parse_args(argv)
    part1 = [e for e in args.engines.split(",") if e]
    bad = [e for e in part1 if e not in ENGINES]
    if bad:
        p.error(f"--engines: {', '.join(bad)} not among {', '.join(ENGINES)}")

    from spark_jobs.connect_server import ConnectServer

    work = Path(tempfile.mkdtemp(prefix="memwal-bench-engines-"))
    if args.no_bytecode:
        TASK_ENV.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=None)
    else:
        TASK_ENV.update(PYTHONDONTWRITEBYTECODE=None, PYTHONPYCACHEPREFIX=str(work / "pycache"))
    template = str(work / "template.lance")
    build(template, args.base_rows, args.regions, args.generations, args.gen_rows)
    print(f"load: {os.getloadavg()}; template: {args.base_rows} base rows, {args.regions} regions x "
          f"{args.generations} generations x {args.gen_rows} rows", flush=True)

    def copy(name: str) -> str:
        dest = str(work / f"{name}.lance")
        shutil.copytree(template, dest)
        return dest

    started = time.monotonic()
    server = ConnectServer(master="local[2]", conf={"spark.driver.extraJavaOptions": FAST_JVM}).start()
    print(f"Spark Connect server up in {time.monotonic() - started:.1f}s at {server.url} (paid once)", flush=True)
    url = server.url
    results: dict = {}
    try:
        # Warm the server's Python workers once (a long-lived server has them warm), and the bytecode cache.
        roots = {"": REPO, **({"baseline ": args.baseline_root.resolve()} if args.baseline_root else {})}
        for root in roots.values():
            maintenance(copy(f"warm-{len(os.listdir(work))}"), "spark_connect", url, root)
        if "overhead" not in args.skip:
            print(f"\n== 1. per-job overhead (task wall - the job's own duration_s), seconds; bytecode "
                  f"{'not ' if args.no_bytecode else ''}compiled", flush=True)
            runs = {(name, e): [] for name in roots for e in part1}
            for k in range(args.repeat):  # the checkouts alternate, the first one changing every round
                order = list(roots.items())[::(-1 if k % 2 else 1)]
                for name, root in order:
                    for e in part1:
                        runs[(name, e)].append(maintenance(copy(f"overhead-{name.strip()}{e}-{k}"), e, url, root))
            rows = {key: [{**rs[0][i], "overhead_s": statistics.median(r[i]["overhead_s"] for r in rs),
                           "cpu_s": statistics.median(r[i]["cpu_s"] for r in rs),
                           "overhead_runs_s": [round(r[i]["overhead_s"], 3) for r in rs]}
                          for i in range(len(JOBS))] for key, rs in runs.items()}
            results["overhead"] = {f"{name}{e}": v for (name, e), v in rows.items()}
            cols = list(rows)
            print(f"   load {os.getloadavg()}")
            print(f"   {'job':<12}" + "".join(f"{name + e:>24}" for name, e in cols)
                  + (f"   (median of {args.repeat})" if args.repeat > 1 else ""))
            for i, (job, _) in enumerate(JOBS):
                print(f"   {job:<12}" + "".join(f"{rows[c][i]['overhead_s']:>24.2f}" for c in cols))
            print("   the task process's CPU seconds (its own; a Connect job's executor work is the server's), "
                  "steadier than wall time on a loaded machine")
            for i, (job, _) in enumerate(JOBS):
                print(f"   {job:<12}" + "".join(f"{rows[c][i]['cpu_s']:>24.2f}" for c in cols))
            for name, e in cols:
                where = {r["job"]: (r["ran_on"] or {}).get("driver", "?") + "/" + str(
                    [v for k, v in (r["ran_on"] or {}).items() if k not in ("plan", "driver")])
                    for r in rows[(name, e)]}
                print(f"   ran on ({name}{e}): {where}")
            for name in roots:
                if (name, "spark_connect") in rows:
                    worst = max(r["overhead_s"] for r in rows[(name, "spark_connect")])
                    print(f"   {name}spark_connect worst per-job overhead {worst:.2f}s (target <= 1.0 s)")
            if args.baseline_root:
                for e in part1:
                    ratios = [rows[("", e)][i]["overhead_s"] / rows[("baseline ", e)][i]["overhead_s"]
                              for i in range(len(JOBS))]
                    cpu = [rows[("", e)][i]["cpu_s"] / rows[("baseline ", e)][i]["cpu_s"] for i in range(len(JOBS))]
                    print(f"   {e}: overhead this / baseline per job " + ", ".join(
                        f"{job} {r:.2f}" for (job, _), r in zip(JOBS, ratios, strict=True))
                          + "; CPU " + ", ".join(f"{c:.2f}" for c in cpu))
        if "small" not in args.skip:
            print("\n== 2. one small table's maintenance run (the DAG's jobs in order)", flush=True)
            walls, finals = {}, {}
            for e in ENGINES:
                t = copy(f"small-{e}")
                runs = maintenance(t, e, url)
                walls[e] = sum(r["wall_s"] for r in runs)
                finals[e] = base_rows(t)
                print(f"   {e:<14} {walls[e]:7.2f}s")
            same = all(finals[e] == finals["in_process"] for e in ENGINES)
            print(f"   spark / spark_connect = {walls['spark'] / walls['spark_connect']:.1f}x (target >= 4x); "
                  f"results identical on every engine: {same}")
            results["small"] = {"wall_s": walls, "identical": same}
        if "fleet" not in args.skip:
            print(f"\n== 3. a fleet of {args.fleet} tables, maintenance cycle, two tasks at a time", flush=True)
            fleet = {}
            for e in ("spark", "spark_connect"):
                tables = [copy(f"fleet-{e}-{i}") for i in range(args.fleet)]
                cpu0, server0, t0 = children_cpu_s(), proc_cpu_s(server.proc.pid), time.monotonic()
                with ThreadPoolExecutor(2) as pool:
                    list(pool.map(lambda t, e=e: maintenance(t, e, url), tables))
                wall = time.monotonic() - t0
                cpu = children_cpu_s() - cpu0 + (proc_cpu_s(server.proc.pid) - server0 if e == "spark_connect" else 0)
                fleet[e] = {"wall_s": wall, "cpu_s": cpu}
                print(f"   {e:<14} wall {wall:8.1f}s  cpu {cpu:8.1f}s", flush=True)
            print(f"   CPU spark / spark_connect = {fleet['spark']['cpu_s'] / fleet['spark_connect']['cpu_s']:.1f}x "
                  f"(target >= 4x); wall {fleet['spark']['wall_s'] / fleet['spark_connect']['wall_s']:.1f}x")
            results["fleet"] = fleet
        if "freshness" not in args.skip:
            print(f"\n== 4. freshness: flush -> merged, p50 of {args.runs}", flush=True)
            fresh = {}
            for e in ENGINES:
                t = copy(f"fresh-{e}")
                run_job("merge", [], t, "in_process", None)  # the backlog merged: only the new generation waits
                times = []
                for k in range(args.runs):
                    flush_one(t, 500, f"f{k}-")
                    t0 = time.monotonic()
                    run_job("merge", [], t, e, url)
                    times.append(time.monotonic() - t0)
                fresh[e] = statistics.median(times)
                print(f"   {e:<14} p50 {fresh[e]:6.2f}s  ({', '.join(f'{x:.2f}' for x in times)})", flush=True)
            results["freshness_p50_s"] = fresh
        if "crossover" not in args.skip:
            print("\n== 5. auto's merge threshold: in process against spark_connect by backlog", flush=True)
            cross = []
            for n in (int(x) for x in args.crossover_rows.split(",")):
                walls = {}
                for e in ("in_process", "spark_connect"):
                    t = str(work / f"cross-{n}-{e}.lance")
                    build(t, args.base_rows, args.regions, 2, n // 2)
                    backlog = sum(f.stat().st_size for f in Path(t, "_mem_wal").rglob("*") if f.is_file())
                    walls[e] = run_job("merge", [], t, e, url)["wall_s"]
                cross.append({"rows_per_region": n, "mem_wal_bytes": backlog, **walls})
                print(f"   {n:>9} rows/region ({backlog / 2**20:7.1f} MiB under _mem_wal): in process "
                      f"{walls['in_process']:6.2f}s, spark_connect {walls['spark_connect']:6.2f}s", flush=True)
            wins = [c for c in cross if c["spark_connect"] < c["in_process"]]
            print("   spark_connect first faster at " + (f"{wins[0]['mem_wal_bytes'] / 2**20:.1f} MiB" if wins else
                                                         "none of these backlogs (on this machine)"))
            results["crossover"] = cross
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + json.dumps(results, default=str)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
