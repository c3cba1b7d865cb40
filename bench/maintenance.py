"""Maintenance benchmark: the merge of many regions, in process and on Spark, in one run.

Tables: a 100,000-row base and N regions (1, 16, 64), each with 2 generations of 1,000 rows written by
Lance core's writer (`mem_wal_writer`, 30% updates of base keys owned by the region, 5% deletes, the rest
inserts). Each contestant merges its own copy; every result is checked equal to the in-process one.

- in process: `merge_table` in a fresh Python process (start-up = interpreter + imports, reported apart);
- Spark: `spark_jobs/merge.py` through the real `spark-submit` (`local[*]` unless told), timed end to end;
  start-up = everything before the merge starts (JVM, session, the executors' Python workers), the merge
  = the job's own `duration_s`, with its breakdown (plan, dedup job, commits; read/dedup/stage inside the
  tasks, summed over tasks);
- scaling: the 16-region merge with `local[1]` against `local[2]`, and on a standalone master with two
  one-core workers started from the pyspark distribution;
- `bench/merge.py --engines local,spark` (one large region: 20 x 50,000-row generations into 2,000,000
  rows; driver memory at the default budgets for 10, 20, 40 generations) unless `--skip-large`.

Prints every ratio against its target. Numbers from a shared, loaded machine are noisy: compare ratios
from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))

from merge import _rows, log  # noqa: E402  (bench/merge.py: the same table, rows and log)
from ports import free_port  # noqa: E402  (scripts/ports.py)

from spark_jobs import submit  # noqa: E402


def build(path: str, regions: int, base_rows: int, generations: int, gen_rows: int, seed: int = 1) -> None:
    """Base table + `regions` regions written by Lance core's ShardWriter; keys never shared by two regions
    (region r owns base keys k with k % regions == r and its own insert range)."""
    rng = np.random.default_rng(seed)
    lance.write_dataset(_rows(np.arange(base_rows), 0), path)
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    n_del = int(gen_rows * 0.05)
    n_upd = int(gen_rows * 0.30)
    n_new = gen_rows - n_del - n_upd
    for r in range(regions):
        owned = np.arange(r, base_rows, regions)
        next_id = base_rows + r * generations * n_new
        with lance.dataset(path).mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=gen_rows) as w:
            for g in range(1, generations + 1):
                upd = rng.choice(owned, size=n_upd, replace=False)
                new = np.arange(next_id, next_id + n_new)
                next_id += n_new
                w.put(_rows(np.concatenate([upd, new]), g))
                w.delete(pa.table({"id": rng.choice(owned, size=n_del, replace=False)}))


def _generations(path: str) -> int:
    root = Path(path) / "_mem_wal"
    return sum(1 for d in root.glob("*/*_gen_*") if d.is_dir())


def child(table: str) -> None:
    """In-process merge in this fresh process: import time and merge time apart."""
    t0 = time.perf_counter()
    from memwal.memory import limit_malloc_arenas
    from memwal.merge import merge_table

    limit_malloc_arenas()  # as `memwal merge` does (memwal.jobs.run_job)
    t1 = time.perf_counter()
    summary = merge_table(table)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "merge_s": t2 - t1, "summary": summary.to_dict()}, default=str))


def run_local(table: str) -> dict:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", table], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"in-process merge failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    s = out["summary"]
    return {"wall_s": wall, "merge_s": out["merge_s"], "startup_s": wall - out["merge_s"],
            "table_commits": s["table_commits"], "timings": s["timings_s"], "failed": s["failed_regions"]}


def run_spark(table: str, master: str, conf: dict | None = None) -> dict:
    cmd = submit.spark_submit_command("merge", table, master=master, conf=conf)
    env = submit.spark_submit_env()
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"spark-submit merge failed ({done.returncode}):\n{done.stderr[-3000:]}")
    s = json.loads(done.stdout.strip().splitlines()[-1])
    merge_s = s["duration_s"]
    return {"wall_s": wall, "merge_s": merge_s, "startup_s": wall - merge_s, "warmup_s": s.get("spark_warmup_s"),
            "table_commits": s["table_commits"], "timings": s["timings_s"], "dedup": s.get("spark_dedup", {}),
            "failed": s["failed_regions"], "master": s.get("spark_master")}


def same_table(a: str, b: str) -> bool:
    return lance.dataset(a).to_table().sort_by("id").equals(lance.dataset(b).to_table().sort_by("id"))


# -- standalone cluster ----------------------------------------------------------------------------------


class Standalone:
    """A standalone master and `workers` one-core workers on 127.0.0.1 (the pyspark distribution); stopped
    on exit (only the processes started here)."""

    def __init__(self, workdir: str, workers: int = 2, memory: str = "2g"):
        self.workdir, self.workers, self.memory = Path(workdir), workers, memory
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> str:
        spark_class = str(Path(submit.spark_home()) / "bin" / "spark-class")
        env = {**os.environ, "SPARK_HOME": submit.spark_home(), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1"}
        port, ui = free_port(), free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)

        def start(name: str, args: list[str]) -> None:
            out = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 - the process owns it
            self.procs.append(subprocess.Popen([spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                               stdin=subprocess.DEVNULL, cwd=self.workdir))

        start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                         "--webui-port", str(ui)])
        url = f"spark://127.0.0.1:{port}"
        for i in range(self.workers):
            start(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                                 "--memory", self.memory, "--webui-port", str(free_port()),
                                 "--work-dir", str(self.workdir / f"work{i}")])
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as resp:
                    state = json.load(resp)
                if sum(w.get("state") == "ALIVE" for w in state.get("workers", [])) >= self.workers:
                    return url
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.__exit__()
                raise SystemExit(f"standalone cluster did not come up; logs in {self.workdir}")
            time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- report ----------------------------------------------------------------------------------------------


def _fmt_spark(r: dict) -> str:
    t, d = r["timings"], r.get("dedup", {})
    inside = ", ".join(f"{k[5:]} {d[k]:.2f}" for k in ("task_read_s", "task_dedup_s", "task_stage_s") if k in d)
    return (f"total {r['wall_s']:6.2f} s = start-up {r['startup_s']:5.2f} s (of which Python workers "
            f"{r.get('warmup_s') or 0:.2f} s) + merge {r['merge_s']:5.2f} s "
            f"[plan {t.get('plan', 0):.2f}, dedup job {t.get('dedup', 0):.2f} (in tasks: {inside or '-'}), "
            f"commits {t.get('commit', 0):.2f} in {r['table_commits']}]")


def _ratio(name: str, value: float, target: str, ok: bool) -> str:
    return f"ratio {name}: {value:.2f}   (target {target}: {'met' if ok else 'NOT met'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regions", default="1,16,64")
    p.add_argument("--base-rows", type=int, default=100_000)
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--gen-rows", type=int, default=1_000)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--scaling-regions", type=int, default=16)
    p.add_argument("--scaling-repeat", type=int, default=5,
                   help="runs per master in the scaling test; the run with the median merge time is reported")
    p.add_argument("--skip-standalone", action="store_true")
    p.add_argument("--skip-large", action="store_true", help="do not run bench/merge.py")
    p.add_argument("--large-args", default="--engines local,spark", help="arguments for bench/merge.py")
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child)
    counts = [int(x) for x in args.regions.split(",") if x]
    work = tempfile.mkdtemp(prefix="bench-maintenance-", dir=args.dir)
    results: dict = {"settings": vars(args), "lance": lance.__version__, "regions": {}}
    try:
        for n in counts:
            src = os.path.join(work, f"src-{n}")
            log(f"building {args.base_rows} base rows + {n} region(s) x {args.generations} generations "
                f"x {args.gen_rows} rows (Lance core writer)")
            build(src, n, args.base_rows, args.generations, args.gen_rows)
            gens = _generations(src)
            assert gens == n * args.generations, f"expected {n * args.generations} generations, found {gens}"
            row: dict = {}
            for name in ("local", "spark"):
                dst = os.path.join(work, f"{name}-{n}")
                shutil.copytree(src, dst)
                log(f"{n} region(s): {name}")
                row[name] = run_local(dst) if name == "local" else run_spark(dst, args.master)
            row["equal"] = same_table(os.path.join(work, f"local-{n}"), os.path.join(work, f"spark-{n}"))
            results["regions"][n] = row
            for name in ("local", "spark"):
                shutil.rmtree(os.path.join(work, f"{name}-{n}"))
            if n != args.scaling_regions:
                shutil.rmtree(src)

        scaling: dict = {}
        n = args.scaling_regions
        src = os.path.join(work, f"src-{n}")
        if not os.path.exists(src):
            build(src, n, args.base_rows, args.generations, args.gen_rows)
        runs: dict[str, list[dict]] = {"local[1]": [], "local[2]": []}
        for i in range(args.scaling_repeat):  # alternate, so that a burst of load hits both
            for master in runs:
                dst = os.path.join(work, f"scale-{master}")
                shutil.copytree(src, dst)
                log(f"scaling: {n} regions on {master} (run {i + 1} of {args.scaling_repeat})")
                runs[master].append(run_spark(dst, master))
                shutil.rmtree(dst)
        for master, rs in runs.items():
            rs.sort(key=lambda r: r["merge_s"])
            scaling[master] = rs[len(rs) // 2]
            scaling[master]["all_merge_s"] = [round(r["merge_s"], 2) for r in rs]
        if not args.skip_standalone:
            dst = os.path.join(work, "scale-standalone")
            shutil.copytree(src, dst)
            log(f"scaling: {n} regions on a standalone master with 2 one-core workers")
            with Standalone(os.path.join(work, "standalone")) as url:
                scaling["standalone 2x1"] = run_spark(dst, url)
            shutil.rmtree(dst)
        results["scaling"] = scaling

        if not args.skip_large:
            out = os.path.join(work, "large.json")
            log("one large region: bench/merge.py " + args.large_args)
            done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "merge.py"), *args.large_args.split(),
                                   "--dir", work, "--out", out], text=True, capture_output=True)
            sys.stderr.write(done.stderr[-2000:])
            if done.returncode != 0:
                raise SystemExit("bench/merge.py failed")
            results["large"] = json.loads(Path(out).read_text())
            results["large_report"] = done.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nmerge of N regions x {args.generations} generations x {args.gen_rows} rows (Lance core writer) "
          f"into {args.base_rows} rows")
    for n, row in results["regions"].items():
        loc, sp = row["local"], row["spark"]
        print(f"  {n:3d} region(s)  in process: total {loc['wall_s']:5.2f} s = start-up {loc['startup_s']:4.2f} s "
              f"+ merge {loc['merge_s']:5.2f} s in {loc['table_commits']} commit(s); result equal: {row['equal']}")
        print(f"                Spark ({sp['master']}): {_fmt_spark(sp)}")
    regions = results["regions"]
    if 1 in regions and 64 in regions:
        r = regions[64]["spark"]["wall_s"] / regions[1]["spark"]["wall_s"]
        print(_ratio("Spark 64 regions / Spark 1 region, start-up included", r, "<= 1.5", r <= 1.5))
    if 64 in regions:
        r = regions[64]["spark"]["merge_s"] / regions[64]["local"]["merge_s"]
        print(_ratio("Spark 64 regions / in-process 64 regions, start-up excluded", r, "<= 2", r <= 2))
    sc = results["scaling"]
    print(f"\nscaling: {args.scaling_regions} regions")
    for master, r in sc.items():
        print(f"  {master:15s} {_fmt_spark(r)}")
        if "all_merge_s" in r:
            print(f"                  (median of {len(r['all_merge_s'])} runs; merge times {r['all_merge_s']})")
    if "local[1]" in sc and "local[2]" in sc:
        r = sc["local[1]"]["merge_s"] / sc["local[2]"]["merge_s"]
        print(_ratio("speedup local[1] -> local[2] (merge, start-up excluded)", r, ">= 1.5", r >= 1.5))
        d1, d2 = sc["local[1]"]["timings"].get("dedup", 0), sc["local[2]"]["timings"].get("dedup", 0)
        if d2:
            print(f"  speedup of the dedup job alone: {d1 / d2:.2f}")
        for master in ("local[1]", "local[2]"):
            r = sc[master]
            t, d = r["timings"], r.get("dedup", {})
            work = sum(d.get(k, 0.0) for k in ("task_read_s", "task_dedup_s", "task_stage_s"))
            overhead = max(0.0, t.get("dedup", 0.0) - work)
            rest = max(0.0, r["merge_s"] - work - overhead - t.get("commit", 0.0))
            print(f"  {master}: task work summed over tasks (read, dedup, stage: what more cores share) {work:.2f} s; "
                  f"not shared: "
                  f"Spark's job and task overhead {overhead:.2f} s, commits {t.get('commit', 0.0):.2f} s, "
                  f"plan and the rest {rest:.2f} s")
            if master == "local[1]":
                ceiling = r["merge_s"] / (r["merge_s"] - work / 2)
        print(f"  if a second core halved local[1]'s task work and the rest stayed the same: speedup {ceiling:.2f}")
    if "local[1]" in sc and "standalone 2x1" in sc:
        r = sc["local[1]"]["merge_s"] / sc["standalone 2x1"]["merge_s"]
        print(f"  speedup local[1] -> standalone, 2 one-core workers (merge): {r:.2f} (reported)")
    if "large" in results:
        print("\none large region (bench/merge.py):")
        print(results["large_report"].rstrip())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2, default=str)


if __name__ == "__main__":
    main()
