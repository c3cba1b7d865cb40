"""The distributed merge apply (issue 26) for bench/merge_scale.py: one large backlog into the largest base,
applied fragment by fragment with its tasks on Spark (`spark_jobs.task_runner.spark_runner`), on each
master given (`local[1]`, `local[2]`, `standalone`: a master and two one-core workers started here).

Per master: the session and its Python workers are started first (not timed); then, each from a restore
of the base, a backlog of N random updates + N/10 deletes and one of N/10 updates + N/100 deletes (the
driver's peak RSS growth is compared between them: 10x the backlog). Lance's threads in each task are
the task's core (LANCE_CPU_THREADS=1 on the executors). The dedup is the Spark job's (`spark_dedup`:
upserts staged as files, which the apply's tasks read; timed apart), as `spark_jobs/merge.py` runs it.
Reported: the apply's seconds (lookups + apply tasks + Update + marker commit), the scaling local[2] /
local[1], and the driver's RSS growth.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from merge import _rows, log

from memwal import merge as memwal_merge
from memwal.writer import RegionWriter, WriterConfig

REPO = Path(__file__).resolve().parents[1]
APPLY_KEYS = ("apply_tasks", "apply_commit", "marker_commit")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class _PeakRss:
    """Peak growth of this process's RSS while the block runs, sampled every 10 ms."""

    def __enter__(self):
        self.start, self.peak, self.done = _rss_mb(), 0.0, False
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done:
            self.peak = max(self.peak, _rss_mb() - self.start)
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        self.done = True
        self.thread.join()


def _backlog(path: str, base_rows: int, updates: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    picked = rng.choice(base_rows, size=updates + updates // 10, replace=False)
    region = str(uuid.uuid4())
    config = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=1 << 40, max_flush_interval_s=None)
    with RegionWriter(path, region, config=config) as w:
        w.put(_rows(np.sort(picked[:updates]), 7))
        w.flush()
        w.delete(pa.table({"id": pa.array(np.sort(picked[updates:]))}))
        w.flush()
    return region


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _standalone(workers: int = 2) -> tuple[str, list[subprocess.Popen]]:
    """A master and `workers` one-core workers from the pyspark distribution on 127.0.0.1."""
    from spark_jobs import submit

    spark_class = str(Path(submit.spark_home()) / "bin" / "spark-class")
    logs = Path(tempfile.mkdtemp(prefix="bench-standalone-"))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    port, ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env, cwd=logs,
                              stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT)]  # noqa: SIM115
    for i in range(workers):
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
             "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir", str(logs / f"w{i}")],
            env=env, cwd=logs, stdout=open(logs / f"worker{i}.log", "w"), stderr=subprocess.STDOUT))  # noqa: SIM115
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as resp:
                if sum(w.get("state") == "ALIVE" for w in json.load(resp).get("workers", [])) >= workers:
                    return url, procs
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    for p in procs:
        p.kill()
    raise RuntimeError(f"the standalone cluster did not come up (logs in {logs})")


def _session(master: str):
    from spark_jobs.common import build_spark

    conf = {"spark.executorEnv.PYTHONPATH": f"{REPO / 'plugins'}:{REPO}",
            "spark.executorEnv.LANCE_CPU_THREADS": "1", "spark.executorEnv.LANCE_IO_THREADS": "4",
            "spark.task.maxFailures": "1"}
    spark, _ = build_spark("bench-merge-apply", master=master, conf=conf)
    return spark


def _checksum(path: str) -> tuple:
    ds = lance.dataset(path)
    rows = ids = 0
    value = 0.0
    for b in ds.to_batches(columns=["id", "value"]):
        rows += b.num_rows
        ids += pc.sum(b.column(0)).as_py() or 0
        value += pc.sum(b.column(1)).as_py() or 0.0
    return rows, ids, round(value, 3)


def distributed(path: str, version: int, base_rows: int, masters: list[str], updates: int) -> dict:
    from spark_jobs.merge_dedup import spark_dedup
    from spark_jobs.task_runner import default_parallelism, spark_runner

    lance.dataset(path, version=version).restore()
    small, big = _backlog(path, base_rows, updates // 10, 11), _backlog(path, base_rows, updates, 12)
    version = lance.dataset(path).version  # the regions are outside the table: restores keep them
    out: dict = {"base_rows": base_rows, "updates": updates, "masters": {}}
    for master in masters:
        procs: list = []
        url = master
        if master == "standalone":
            url, procs = _standalone()
        spark = _session(url)
        try:
            cores = default_parallelism(spark)
            runner = spark_runner(spark, "bench merge apply")
            runner(lambda x: x, list(range(cores)))  # start the Python workers (not timed)
            res = {"cores": cores}
            for label, region in (("small", small), ("big", big)):
                lance.dataset(path, version=version).restore()
                os.sync()  # the previous run's written fragments reach the disk before this run, not during it
                log(f"distributed apply on {master}: {label} backlog")
                with _PeakRss() as rss:
                    dedup, after_dedup = spark_dedup(spark), []

                    def timed(call, after_dedup=after_dedup, rss=rss):
                        def run(*args):
                            out = call(*args)
                            after_dedup.append(rss.peak)  # the driver's peak growth up to the dedup's result
                            return out
                        return run

                    timed_dedup = timed(dedup)
                    timed_dedup.batch = timed(dedup.batch)  # the round's one Spark job, as the merge calls it

                    t = time.perf_counter()
                    summary = memwal_merge.merge_table(
                        path, regions=[region], config=memwal_merge.MergeConfig(apply="fragments"),
                        dedup=timed_dedup, runner=runner, parallelism=cores)
                    wall = time.perf_counter() - t
                if summary.failed_regions:
                    raise SystemExit(f"merge failed on {master}: {summary.to_dict()}")
                timings = dict(summary.timings_s)
                res[label] = {"s": wall, "apply_s": sum(timings.get(k, 0.0) for k in APPLY_KEYS),
                              "timings": timings, "rss_growth_mb": rss.peak,
                              "rss_dedup_mb": max(after_dedup, default=0.0), "checksum": _checksum(path)}
            out["masters"][master] = res
        finally:
            spark.stop()
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
    lance.dataset(path, version=version).restore()
    return out


def report(d: dict) -> None:
    print(f"\ndistributed apply: {d['updates']:,} random updates + {d['updates'] // 10:,} deletes into "
          f"{d['base_rows']:,} rows (small backlog: a tenth)")
    sums = set()
    for master, r in d["masters"].items():
        for label in ("small", "big"):
            x = r[label]
            sums.add(x["checksum"])
            parts = ", ".join(f"{k} {v:.2f}" for k, v in x["timings"].items())
            print(f"  {master:11s} {label:5s} ({r['cores']} cores): apply {x['apply_s']:7.2f} s, whole merge "
                  f"{x['s']:7.2f} s ({parts}); driver RSS +{x['rss_growth_mb']:.0f} MiB (+{x['rss_dedup_mb']:.0f} "
                  f"by the dedup's result)")
    m = d["masters"]
    if "local[1]" in m and "local[2]" in m:
        print(f"  apply local[1] / local[2]: {m['local[1]']['big']['apply_s'] / m['local[2]']['big']['apply_s']:.2f}"
              f"   (target >= 1.6 on >= 10 s of apply work; local[1] did {m['local[1]']['big']['apply_s']:.1f} s)")
    if "standalone" in m and "local[1]" in m:
        print(f"  apply local[1] / standalone (2 x 1 core): "
              f"{m['local[1]']['big']['apply_s'] / m['standalone']['big']['apply_s']:.2f}")
    for master, r in m.items():
        print(f"  driver RSS growth on {master}, 10x backlog: +{r['small']['rss_growth_mb']:.0f} -> "
              f"+{r['big']['rss_growth_mb']:.0f} MiB")
    print(f"  every master's table equal: {len(sums) == 2}")
