"""Due work shares Spark (issue 43, item 4): 20 small tables with due work, today's way against one batch.

    .venv/bin/python bench/fleet_spark.py [--tables 20] [--sample 2] [--full] [--master local[2]] [--out F.json]

Every table is a copy of one template (a base of 100 rows with a BTREE index, one region, 2 flushed
generations of 20 rows: merge and snapshot due). The due jobs come from the probe (`memwal.probe`).
- today: each due job of each table through `memwal.engines.dispatch` on engine `spark` (the `memwal --spark`
  path and the maintenance DAG's `spark` engine): a job with executor work is one spark-submit application,
  one without runs in process. Run on `--sample` tables (measured: applications started and wall seconds),
  and counted for the others from the same plan and choice (`plan_work`, `choose_engine`) without running;
  the fleet's wall time is the sample's seconds per table times the tables (`--full`: run every table).
- batch: every table's due jobs packed (`memwal.fleet_batch.pack_batches`) and each batch run as one
  spark-submit application of `spark_jobs/fleet.py` (`spark_jobs.fleet_runners.run_fleet_submit`).
Printed: applications started and wall seconds for each, their ratios, and that both ways leave every table
with the rows its LSM view had (and nothing more due of what was due).

Target: applications with 20 small tables due <= 2 (today >= 20).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO)]

import lance  # noqa: E402
import pyarrow as pa  # noqa: E402

from memwal.engines import choose_engine, dispatch, plan_work  # noqa: E402
from memwal.fleet_batch import from_probe, pack_batches  # noqa: E402
from memwal.probe import probe_table  # noqa: E402
from memwal.reader import LsmReader  # noqa: E402
from memwal.table import MemWalTable  # noqa: E402
from memwal.writer import RegionWriter, WriterConfig  # noqa: E402
from spark_jobs.fleet_runners import run_fleet_submit  # noqa: E402
from spark_jobs.submit import SparkSubmitRunner  # noqa: E402

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("name", pa.string()),
                    pa.field("score", pa.float64())])
FAST_JVM = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def _rows(ids, tag: str) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids], "score": [i / 2 for i in ids]}, schema=SCHEMA)


def build_template(path: str) -> None:
    lance.write_dataset(_rows(range(100), "base"), path)
    lance.dataset(path).create_scalar_index("name", "BTREE", name="name_idx")
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    config = WriterConfig(max_memtable_rows=10**9, max_flush_interval_s=None)
    with RegionWriter(path, str(uuid.uuid4()), config=config) as w:
        for g in range(2):
            w.put(_rows(range(90 + 10 * g, 110 + 10 * g), f"g{g}-"))
            w.flush()


def view(path: str) -> list:
    return sorted(LsmReader(path).scan().to_pylist(), key=lambda r: r["id"])


def base(path: str) -> list:
    return sorted(lance.dataset(path).to_table(columns=["id", "name", "score"]).to_pylist(), key=lambda r: r["id"])


def today(paths: list[str], run: int, master: str) -> dict:
    """Each due job of each table through dispatch on engine spark; the first `run` tables run for real."""
    runner = SparkSubmitRunner(master=master, conf=FAST_JVM)
    apps_run = apps_counted = 0
    started = time.monotonic()
    for i, path in enumerate(paths):
        entry = from_probe(probe_table(path))
        if entry is None:
            continue
        table = MemWalTable(path)
        for job in entry.jobs:
            if i < run:
                summary = dispatch(job, table, entry.options, engine="spark", runners={"spark": runner})
                apps_run += summary["engine"] == "spark"
            else:
                plan = plan_work(job, table, entry.options)
                apps_counted += choose_engine("spark", plan).engine == "spark"
        if i == run - 1:
            wall_run = time.monotonic() - started
    per_table = wall_run / run
    return {"tables_run": run, "applications_run": apps_run, "wall_s_run": round(wall_run, 1),
            "applications": apps_run + apps_counted, "wall_s": round(per_table * len(paths), 1),
            "wall_s_per_table": round(per_table, 1)}


def batch(paths: list[str], master: str) -> dict:
    entries = [e for e in (from_probe(probe_table(p)) for p in paths) if e is not None]
    batches = pack_batches(entries)
    started = time.monotonic()
    summaries = [run_fleet_submit(b, master=master, conf=FAST_JVM, timeout=1800) for b in batches]
    wall = time.monotonic() - started
    failed = [u for s in summaries for u in s["failed_tables"]]
    if failed:
        raise SystemExit(f"batch: tables failed: {failed}")
    return {"applications": len({s["spark_application_id"] for s in summaries}), "wall_s": round(wall, 1),
            "jobs_run": sum(s["jobs_run"] for s in summaries), "due_jobs": sum(len(e.jobs) for e in entries),
            "spark_session_s": [s["spark_session_s"] for s in summaries]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=20)
    p.add_argument("--sample", type=int, default=2, help="tables run today's way (the rest counted)")
    p.add_argument("--full", action="store_true", help="run every table today's way")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-spark-"))
    try:
        template = str(root / "template")
        build_template(template)
        want = view(template)
        copies = {way: [str(root / f"{way}-{i}") for i in range(args.tables)] for way in ("today", "batch")}
        for paths in copies.values():
            for path in paths:
                shutil.copytree(template, path)
        due = from_probe(probe_table(template))
        print(f"{args.tables} tables, due on each: {list(due.jobs)} ({due.bytes} bytes)", flush=True)
        sample = args.tables if args.full else min(args.sample, args.tables)
        t = today(copies["today"], sample, args.master)
        print(f"today: {t['applications']} applications ({t['applications_run']} started on {sample} table(s) in "
              f"{t['wall_s_run']} s; {t['wall_s_per_table']} s a table), fleet {t['wall_s']} s", flush=True)
        b = batch(copies["batch"], args.master)
        print(f"batch: {b['applications']} application(s), {b['jobs_run']} of {b['due_jobs']} due jobs, "
              f"{b['wall_s']} s (session start {b['spark_session_s']} s)", flush=True)
        for path in copies["batch"] + copies["today"][:sample]:
            assert base(path) == want, f"{path}: the base table is not the LSM view it had"
        ratios = {"applications": round(t["applications"] / b["applications"], 1),
                  "wall_s": round(t["wall_s"] / b["wall_s"], 1)}
        print(f"ratios today/batch: applications {ratios['applications']}x, wall {ratios['wall_s']}x "
              f"(target: batch applications <= 2: {'met' if b['applications'] <= 2 else 'NOT met'})")
        if args.out:
            Path(args.out).write_text(json.dumps({"today": t, "batch": b, "ratios": ratios}, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
