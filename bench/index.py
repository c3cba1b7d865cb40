"""Index catch-up benchmark (issue 24): a batch of new rows indexed into an IVF_PQ index and into an FTS
(INVERTED) index, in process and with the segments built on Spark, in one run.

Table: `--base-rows` rows (128-dim vectors of an 8-dim latent, a short text), IVF_PQ (64 partitions, 16
sub-vectors) and INVERTED indexes built over them, then `--rows` new rows appended in 32 fragments no index
covers. Each contestant catches up its own copy, one index at a time, in a fresh Python process (its peak
RSS, VmHWM, is the driver's), with the segment bound off: the build alone (the policy's fold runs in process
on every engine and, every fragment here being small, would fold the new segments with the base one):
- in process: `catchup_table` (Lance's optimize_indices, Lance's default threads);
- Spark local[1], local[2], and a standalone master with two one-core workers (pyspark's distribution):
  `catchup_table(distributed=spark_jobs.catchup.distributed_build(spark))`: one segment per task slot, Lance's
  threads sized to spark.task.cpus; the catch-up's own duration (the session's start-up and a first job
  that starts the executors' Python workers reported apart: a catch-up job pays them once).
Recall@10 (nprobes 8 of 64, no refine) against exact search over the whole table after catch-up, against
the recall of the index right after it was created: over the base rows, and (the target's reference) an
index created now over every row with the same parameters. The driver's peak RSS of the Spark path at half and all of
the rows (`--rss-check`, local[2]).
`--threshold` times in process against Spark local[2] at a few row counts: where the Spark path starts to
pay (`memwal.index_build.DISTRIBUTED_MIN_ROWS`).

Prints each figure and each ratio against its target. A shared machine gives noisy ratios: compare ratios of
the same run.
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

import lance
import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "scripts"))

DIM, PARTITIONS, SUB_VECTORS, NPROBES = 128, 64, 16, 8
WORDS = [f"w{i}" for i in range(2000)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _embed(latent: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Vectors with a low intrinsic dimension (as embeddings have): an 8-dim latent projected to DIM, plus a
    little noise, so nearest neighbours are meaningful and recall measures the index."""
    projection = np.random.default_rng(0).standard_normal((latent.shape[1], DIM)).astype("float32")
    return (latent @ projection + 0.05 * rng.standard_normal((len(latent), DIM))).astype("float32")


def _rows(lo: int, hi: int) -> pa.Table:
    rng = np.random.default_rng(lo)
    ids = np.arange(lo, hi)
    vec = _embed(rng.standard_normal((len(ids), 8)).astype("float32"), rng)
    words = rng.integers(0, len(WORDS), (len(ids), 12))
    text = [" ".join(WORDS[w] for w in row) for row in words]
    return pa.table({"id": pa.array(ids, pa.int64()), "text": text,
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel(), pa.float32()), DIM)})


def _queries(n: int = 50) -> np.ndarray:
    rng = np.random.default_rng(99)
    return _embed(rng.standard_normal((n, 8)).astype("float32"), rng)


def recall(ds: lance.LanceDataset) -> float:
    """Mean recall@10 of the ANN search (nprobes NPROBES, no refine) against exact search."""
    hits = 0
    qs = _queries()
    for q in qs:
        ann = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": 10, "nprobes": NPROBES})["id"]
        exact = ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": 10, "use_index": False})["id"]
        hits += len(set(ann.to_pylist()) & set(exact.to_pylist()))
    return hits / (10 * len(qs))


def build(path: str, base_rows: int, rows: int) -> float:
    """The table at `path`; returns the recall right after the index was created (over the base rows)."""
    from memwal.table import MemWalTable

    ds = lance.write_dataset(_rows(0, base_rows), path, max_rows_per_file=max(1, base_rows // 4))
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=PARTITIONS, num_sub_vectors=SUB_VECTORS)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    at_creation = recall(lance.dataset(path))
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    step = max(1, rows // 32)
    for lo in range(base_rows, base_rows + rows, step):
        lance.write_dataset(_rows(lo, min(lo + step, base_rows + rows)), path, mode="append")
    assert MemWalTable(path).refresh().dataset.count_rows() == base_rows + rows
    return at_creation


def recall_created_over_all(template: str, work: str) -> float:
    """The recall of an index created now over every row of the template (same parameters)."""
    path = os.path.join(work, "fresh")
    shutil.copytree(template, path)
    lance.dataset(path).create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=PARTITIONS,
                                     num_sub_vectors=SUB_VECTORS, replace=True)
    value = recall(lance.dataset(path))
    shutil.rmtree(path)
    return value


def _warm(_: int) -> int:
    """A first task per slot: starts the executor's Python worker and imports what a segment build imports
    (about a second per worker, once per job): reported apart from the build, as the session's start-up."""
    import memwal.index_build  # noqa: F401

    return 0


def child(table: str, engine: str) -> None:
    """One contestant in this fresh process: catch up vec_idx, then text_idx; JSON on stdout."""
    from memwal.catchup import catchup_table
    from memwal.maintenance_config import IndexPolicy
    from memwal.memory import limit_malloc_arenas

    limit_malloc_arenas()
    out: dict = {"engine": engine}
    distributed = None
    if engine != "in_process":
        from spark_jobs import common, submit
        from spark_jobs.catchup import distributed_build

        t = time.perf_counter()
        conf = {"spark.executor.memory": "1g", "spark.pyspark.python": sys.executable}
        spark, _ = common.build_spark("bench-index", master=engine, conf=conf)
        if not engine.startswith("local"):
            spark.sparkContext.addPyFile(submit.package_code())
            spark.range(0, 2, 1, 2).count()  # both executors up before the plan reads the slots
        distributed = distributed_build(spark, min_rows=0)
        out["startup_s"] = time.perf_counter() - t
        t = time.perf_counter()
        distributed.runner(_warm, list(range(distributed.groups)))  # the executors' Python workers start
        out["first_job_s"] = time.perf_counter() - t
        out["groups"], out["threads"] = distributed.groups, distributed.threads
    for name in ("vec_idx", "text_idx"):
        t = time.perf_counter()
        # The build alone: no fold (every fragment here is small, so the policy would fold the new segments
        # with the base one in process on every engine, as it must for compaction to combine them).
        summary = catchup_table(table, index_names=[name], distributed=distributed,
                                policy=IndexPolicy(max_segments=None))
        (r,) = summary.indexes
        if r.error or not r.covered:
            raise SystemExit(f"{engine}: catch-up of {name} failed: {r.error or 'not covered'}")
        out[name] = {"s": time.perf_counter() - t, "where": r.where, "why": r.why, "segments": r.segments_built,
                     "rows": r.rows_to_index}
    with open("/proc/self/status") as f:  # the catch-up's peak, before the searches below read the table
        out["peak_rss_mb"] = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    ds = lance.dataset(table)
    assert all(ds.stats.index_stats(n)["num_unindexed_rows"] == 0 for n in ("vec_idx", "text_idx"))
    out["recall"] = recall(ds)
    out["fts_hits"] = sorted(ds.to_table(columns=["id"], full_text_query="w7", limit=10**9)["id"].to_pylist())
    print(json.dumps(out), flush=True)


def contest(template: str, work: str, engine: str) -> dict:
    path = os.path.join(work, engine.replace("/", "_").replace(":", "_").replace("[", "_").replace("]", ""))
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(template, path)
    os.sync()  # the copy's write-back is done before the timed catch-up, not during it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "plugins"), REPO])}
    done = subprocess.run([sys.executable, __file__, "--child", path, "--engine", engine], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"{engine}: start-up {result.get('startup_s', 0):.1f} s + first job {result.get('first_job_s', 0):.1f} s, "
        f"vec_idx {result['vec_idx']['s']:.2f} s ({result['vec_idx']['where']}, "
        f"{result['vec_idx']['segments']} segments), text_idx {result['text_idx']['s']:.2f} s, recall "
        f"{result['recall']:.3f}, driver peak RSS {result['peak_rss_mb']:.0f} MiB")
    return result


def _ratio(name: str, value: float, target: str, ok: bool) -> str:
    return f"{name}: {value:.2f} (target {target}) {'OK' if ok else 'MISSED'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=100_000)
    p.add_argument("--rows", type=int, default=400_000, help="new rows to index")
    p.add_argument("--skip-standalone", action="store_true")
    p.add_argument("--rss-check", action="store_true", help="local[2] at half the rows too: driver RSS flat")
    p.add_argument("--threshold", default=None, metavar="N,N,...",
                   help="only time in process against local[2] at these row counts")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.engine)
        return
    from ports import free_port  # noqa: F401 - scripts/ports.py (the standalone cluster's ports)

    work = tempfile.mkdtemp(prefix="bench-index-")
    try:
        if args.threshold:
            for n in (int(x) for x in args.threshold.split(",")):
                template = os.path.join(work, f"t{n}")
                build(template, args.base_rows, n)
                a, b = contest(template, work, "in_process"), contest(template, work, "local[2]")
                for name in ("vec_idx", "text_idx"):
                    print(f"{n:>9} rows {name}: in process {a[name]['s']:.2f} s, Spark local[2] {b[name]['s']:.2f} s "
                          f"(+ {b['first_job_s']:.1f} s first job, {b['startup_s']:.1f} s session start-up)")
            return
        template = os.path.join(work, "template")
        log(f"building {args.base_rows} base rows + {args.rows} new rows")
        at_base = build(template, args.base_rows, args.rows)
        at_creation = recall_created_over_all(template, work)
        log(f"recall@10 at creation: {at_base:.3f} over the base rows, {at_creation:.3f} created over every row")
        results = {e: contest(template, work, e) for e in ("in_process", "local[1]", "local[2]")}
        if not args.skip_standalone:
            from maintenance import Standalone

            with Standalone(os.path.join(work, "standalone"), workers=2) as url:
                results["standalone 2x1"] = contest(template, work, url)
        print(f"\nindex catch-up of {args.rows} new rows into {args.base_rows} (load: {os.getloadavg()[0]:.2f}); "
              f"recall@10 at creation {at_base:.3f} (base rows), {at_creation:.3f} (created over every row)")
        print("  engine          vec_idx s  text_idx s  segments  recall@10  driver peak RSS MiB")
        for name, r in results.items():
            print(f"  {name:14s}  {r['vec_idx']['s']:9.2f}  {r['text_idx']['s']:10.2f}  {r['vec_idx']['segments']:8d}"
                  f"  {r['recall']:9.3f}  {r['peak_rss_mb']:8.0f}")
        one, two = results["local[1]"], results["local[2]"]
        for name in ("vec_idx", "text_idx"):
            v = one[name]["s"] / two[name]["s"]
            print("  " + _ratio(f"{name} local[2] / local[1] speed-up", v, ">= 1.6", v >= 1.6))
        floor = at_creation - 0.02
        for name, r in results.items():
            print("  " + _ratio(f"recall@10 after catch-up ({name}) vs at creation {at_creation:.3f}", r["recall"],
                                f">= {floor:.3f}", r["recall"] >= floor))
        same = {json.dumps(r["fts_hits"]) for r in results.values()}
        print(f"  FTS results equal across engines: {len(same) == 1}")
        if args.rss_check:
            half = os.path.join(work, "half")
            build(half, args.base_rows, args.rows // 2)
            small = contest(half, work, "local[2]")
            v = two["peak_rss_mb"] / small["peak_rss_mb"]
            print("  " + _ratio(f"driver peak RSS local[2], {args.rows} / {args.rows // 2} rows", v, "<= 1.15",
                                v <= 1.15))
            v = results["in_process"]["peak_rss_mb"] / small["peak_rss_mb"]
            print(f"  (in process, for reference: {results['in_process']['peak_rss_mb']:.0f} MiB at {args.rows} rows)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
