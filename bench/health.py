"""Health benchmark: does the maintenance DAG alone keep a table bounded? One run, ratios printed.

1. Cycles: one table (a 1,000,000-row base, 4 regions) through 40 cycles of writes (per region and cycle one
   generation of 25,000 upserts of keys the region owns, drawn from a fixed key space, and 1,250 deletes: a
   steady workload) each followed by the maintenance DAG's jobs in its order: merge -> catch-up ->
   compaction when due -> retention -> snapshot -> GC. Once with retention and compaction on (policy:
   versions older than 0 s go, keep the newest 10; compaction due at 2 small fragments or a deleted-row
   ratio of 0.1) and once off (GC still runs). At cycles 10, 20 and 40: fragments, table versions, bytes of
   the base table and of `_mem_wal` (`memwal.health`), generation directories, the merge's time (median of
   the last 5 cycles' merges) and driver peak RSS (VmHWM of a fresh process that runs that cycle's merge).
   Targets (on): cycle 40 within 1.2x of cycle 10 for storage, fragments and versions; merge time and peak
   RSS within 15%.
2. Compaction on Spark: a 64-fragment table compacted in process and by `spark_jobs/compaction.py` through
   spark-submit on local[2] (tasks on the executors); the ratio of the jobs' own durations.
3. Compaction while merges run (`--skip-contention` leaves it out): a 64-fragment table merged in a loop by
   another process (each merge upserts random keys, so it writes deletion vectors into most fragments), and
   a forced compaction with the MemWAL index lock (`use_lock`) and without: preempted commits, tasks
   committed, and the merges' durations meanwhile.
4. Vector cycles (`--vector-cycles`, 0 leaves them out): a table with an IVF_PQ index on a float32 vector
   column and an FTS (INVERTED) index on a text column beside the BTREE, through the same cycles (retention
   and compaction on), once with the default index policy (catch-up folds segments past
   DEFAULT_MAX_INDEX_SEGMENTS or when they block a due compaction) and once unfolded
   (`IndexPolicy(max_segments=None)`: Lance's default, a vector segment per catch-up). At the measured
   cycles: fragments, segments per index, base bytes, the merge's time, and (printed, no target) the median
   time of an ANN search and of an FTS query. Target (folded): cycle 40 within 1.2x of cycle 10 for the
   first four; unfolded: the growth.
5. `--scaling`: issue 10's scaling on a workload with more than 5 s of task work on local[1] (16 regions x
   4 generations x 300,000 rows into 2,000,000), through bench/maintenance.py's harness: local[1] against
   local[2].

Numbers from a shared, loaded machine are noisy: compare ratios from the same run.
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
import uuid

import lance
import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, REPO)

from merge import SCHEMA, _rows, _rss_mb, log  # noqa: E402  (bench/merge.py: rows, VmHWM, log)

from memwal.catchup import catchup_table  # noqa: E402
from memwal.compaction import compact_table  # noqa: E402
from memwal.gc import GcConfig, gc_table  # noqa: E402
from memwal.health import table_health  # noqa: E402
from memwal.index_segments import segment_counts  # noqa: E402
from memwal.maintenance_config import CompactionConfig, IndexPolicy, RetentionConfig  # noqa: E402
from memwal.merge import merge_table  # noqa: E402
from memwal.retention import retain_versions  # noqa: E402
from memwal.snapshot import refresh_snapshot  # noqa: E402
from memwal.writer import RegionWriter, WriterConfig  # noqa: E402
from spark_jobs import submit  # noqa: E402

ONE_GEN_PER_FLUSH = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=10**12, max_flush_interval_s=None)
RETENTION_ON = RetentionConfig(older_than_s=0, keep_versions=10)
COMPACTION_ON = CompactionConfig(max_small_fragments=2, max_deleted_ratio=0.1)
VECTOR_DIM = 32
WORDS = np.array([f"w{i}" for i in range(2000)])
VECTOR_SCHEMA = pa.schema([SCHEMA.field("id"), SCHEMA.field("name"), pa.field("text", pa.string()),
                           pa.field("vec", pa.list_(pa.float32(), VECTOR_DIM))])
POLICIES = {"folded": IndexPolicy(), "unfolded": IndexPolicy(max_segments=None)}


def build(path: str, base_rows: int, regions: int) -> list[str]:
    lance.write_dataset(_rows(np.arange(base_rows), 0), path)
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    lance.dataset(path).create_scalar_index("name", "BTREE", name="name_idx")
    return [str(uuid.uuid4()) for _ in range(regions)]


def vector_rows(ids: np.ndarray, tag: int) -> pa.Table:
    """id, name, a text of 8 words and a random vector per row (seeded by the tag and the first id: an upsert
    changes both)."""
    rng = np.random.default_rng([tag, int(ids[0]) if len(ids) else 0])
    text = [" ".join(ws) for ws in WORDS[rng.integers(0, len(WORDS), (len(ids), 8))]]
    vec = rng.standard_normal((len(ids), VECTOR_DIM), dtype=np.float32).ravel()
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{tag}-{i}" for i in ids.tolist()]),
                     "text": text, "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec), VECTOR_DIM)},
                    schema=VECTOR_SCHEMA)


def build_vector(path: str, base_rows: int, regions: int) -> list[str]:
    """The cycles' table with IVF_PQ (16 partitions) on `vec` and INVERTED on `text` beside the BTREE."""
    lance.write_dataset(vector_rows(np.arange(base_rows), 0), path)
    ds = lance.dataset(path)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=16, num_sub_vectors=8)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    ds.create_scalar_index("name", "BTREE", name="name_idx")
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    return [str(uuid.uuid4()) for _ in range(regions)]


def write_cycle(path: str, regions: list[str], key_space: int, rows: int, rng: np.random.Generator, tag: int,
                make_rows=_rows) -> None:
    """One generation per region: upserts and deletes of keys the region owns (k % regions == r)."""
    n = len(regions)
    for r, region in enumerate(regions):
        owned = np.arange(r, key_space, n)
        with RegionWriter(path, region, config=ONE_GEN_PER_FLUSH) as w:
            w.put(make_rows(rng.choice(owned, size=rows, replace=False), tag))
            w.delete(pa.table({"id": rng.choice(owned, size=rows // 20, replace=False)}))


def merge_child(path: str) -> None:
    """The merge in this fresh process: its time and the process's peak RSS."""
    from memwal.memory import limit_malloc_arenas

    limit_malloc_arenas()  # as `memwal merge` does
    t = time.perf_counter()
    summary = merge_table(path)
    print(json.dumps({"merge_s": time.perf_counter() - t, "peak_rss_mb": _rss_mb("VmHWM:"),
                      "failed": summary.failed_regions}))


def measured_merge(path: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--merge-child", path], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"merge child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def maintain(path: str, on: bool, measure: bool, policy: IndexPolicy | None = None) -> dict:
    """The maintenance DAG's jobs in its order; the merge in a fresh process when measured."""
    out = measured_merge(path) if measure else {"merge_s": None}
    if not measure:
        t = time.perf_counter()
        merge_table(path)
        out["merge_s"] = time.perf_counter() - t
    t = time.perf_counter()
    catchup_table(path, policy=policy, compaction=COMPACTION_ON if on else None)
    out["catchup_s"] = time.perf_counter() - t
    if on:
        c = compact_table(path, config=COMPACTION_ON)
        out["compacted"] = c.tasks_committed
        retain_versions(path, config=RETENTION_ON)
    refresh_snapshot(path)
    gc_table(path, config=GcConfig(grace_period_s=0))
    return out


def _cycles(path: str, ids: list[str], label: str, on: bool, policy: IndexPolicy | None, cycles: int,
            measure_at: set[int], base_rows: int, rows: int, seed: int, make_rows, point) -> dict:
    """`cycles` rounds of writes and the maintenance jobs on the table at `path`; at each cycle of measure_at
    the merge time (median of the last five), the table's health and `point(path, health)`."""
    rng = np.random.default_rng(seed)
    points: dict[int, dict] = {}
    merge_times: list[float] = []
    started = time.perf_counter()
    for c in range(1, cycles + 1):
        write_cycle(path, ids, base_rows, rows, rng, c, make_rows)
        m = maintain(path, on, c in measure_at, policy)
        merge_times.append(m["merge_s"])
        if c in measure_at:
            h = table_health(path)
            window = sorted(merge_times[-5:])  # one merge is too short to time alone on a shared machine
            m["merge_s_this_cycle"], m["merge_s"] = m["merge_s"], window[len(window) // 2]
            points[c] = {**m, **point(path, h), "fragments": h.fragments, "base_bytes": h.base_bytes,
                         "rows": lance.dataset(path).count_rows()}
            log(f"{label} cycle {c}: {json.dumps(points[c])}")
    shutil.rmtree(path)
    return {"points": points, "total_s": time.perf_counter() - started}


def run_cycles(work: str, on: bool, cycles: int, measure_at: set[int], base_rows: int, regions: int, rows: int,
               seed: int) -> dict:
    path = os.path.join(work, f"cycles-{'on' if on else 'off'}")
    ids = build(path, base_rows, regions)
    return _cycles(path, ids, "on " if on else "off", on, None, cycles, measure_at, base_rows, rows, seed, _rows,
                   lambda _path, h: {"table_versions": h.table_versions, "mem_wal_bytes": h.mem_wal_bytes,
                                     "generation_dirs": h.generation_dirs})


def query_times(path: str, n: int = 20) -> dict:
    """Median milliseconds of n ANN searches (k 10, Lance's default probes) and n FTS queries of one word."""
    ds = lance.dataset(path)
    rng = np.random.default_rng(5)
    out = {}
    for key, kwargs in (("ann_ms", lambda i: {"nearest": {"column": "vec", "k": 10,
                                                           "q": rng.standard_normal(VECTOR_DIM, dtype=np.float32)}}),
                        ("fts_ms", lambda i: {"full_text_query": {"query": str(WORDS[i]), "columns": ["text"]},
                                              "limit": 10})):
        times = []
        for i in range(n):
            t = time.perf_counter()
            ds.to_table(columns=["id"], **kwargs(i))
            times.append((time.perf_counter() - t) * 1000)
        out[key] = sorted(times)[n // 2]
    return out


def run_vector_cycles(work: str, policy: str, cycles: int, measure_at: set[int], base_rows: int, regions: int,
                      rows: int, seed: int) -> dict:
    """The cycles (retention and compaction on) on the vector table, catch-up under POLICIES[policy]."""
    path = os.path.join(work, f"vector-{policy}")
    ids = build_vector(path, base_rows, regions)

    def point(path: str, _h) -> dict:
        segments = segment_counts(lance.dataset(path))
        return {**query_times(path), "vec_segments": segments["vec_idx"], "text_segments": segments["text_idx"]}

    return _cycles(path, ids, f"vector {policy}", True, POLICIES[policy], cycles, measure_at, base_rows, rows, seed,
                   vector_rows, point)


def fragmented_table(path: str, fragments: int, rows_per_fragment: int) -> None:
    lance.write_dataset(_rows(np.arange(fragments * rows_per_fragment), 0), path, max_rows_per_file=rows_per_fragment)
    lance.dataset(path).initialize_mem_wal(unsharded=True)


def compaction_on_spark(work: str, fragments: int, rows_per_fragment: int, target: int) -> dict:
    src = os.path.join(work, "frag-src")
    fragmented_table(src, fragments, rows_per_fragment)
    out: dict = {}
    local = os.path.join(work, "frag-local")
    shutil.copytree(src, local)
    s = compact_table(local, config=CompactionConfig(force=True, target_rows_per_fragment=target))
    out["in_process"] = {"duration_s": s.duration_s, "tasks": s.tasks_committed,
                         "fragments_after": s.health_after["fragments"]}
    spark = os.path.join(work, "frag-spark")
    shutil.copytree(src, spark)
    cmd = submit.spark_submit_command("compaction", spark, master="local[2]",
                                      extra_args=["--force", "--target-rows-per-fragment", str(target)])
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=submit.spark_submit_env())
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"spark-submit compaction failed:\n{done.stderr[-3000:]}")
    js = json.loads(done.stdout.strip().splitlines()[-1])
    out["local[2]"] = {"duration_s": js["duration_s"], "wall_s": wall, "tasks": js["tasks_committed"],
                       "fragments_after": js["health_after"]["fragments"]}
    out["equal"] = lance.dataset(local).to_table().sort_by("id").equals(lance.dataset(spark).to_table().sort_by("id"))
    for p in (src, local, spark):
        shutil.rmtree(p)
    return out


def merger_child(path: str, stop_file: str) -> None:
    """Until stop_file exists: write one generation of random upserts into one region, merge it; one JSON
    line per merge (its duration)."""
    rng = np.random.default_rng(3)
    region = str(uuid.uuid4())
    n = lance.dataset(path).count_rows()
    tag = 1000
    while not os.path.exists(stop_file):
        tag += 1
        with RegionWriter(path, region, config=ONE_GEN_PER_FLUSH) as w:
            w.put(_rows(rng.choice(n, size=2_000, replace=False), tag))
        t = time.perf_counter()
        merge_table(path)
        print(json.dumps({"merge_s": time.perf_counter() - t, "at": time.time()}), flush=True)


def compaction_under_merges(work: str, fragments: int, rows_per_fragment: int, target: int) -> dict:
    out: dict = {}
    for use_lock in (False, True):
        path = os.path.join(work, f"contention-{use_lock}")
        fragmented_table(path, fragments, rows_per_fragment)
        stop = os.path.join(work, f"stop-{use_lock}")
        child = subprocess.Popen([sys.executable, __file__, "--merger-child", path, stop], stdout=subprocess.PIPE,
                                 text=True)
        while not (child.stdout.readline() or child.poll() is not None):  # the first merge is done
            pass
        started = time.time()
        s = compact_table(path, config=CompactionConfig(force=True, target_rows_per_fragment=target,
                                                        use_lock=use_lock, max_attempts=10))
        ended = time.time()
        open(stop, "w").close()
        lines, _ = child.communicate(timeout=600)
        merges = [json.loads(x) for x in lines.splitlines() if x.startswith("{")]
        during = sorted(m["merge_s"] for m in merges if started <= m["at"] <= ended + 60)
        out["lock" if use_lock else "no lock"] = {
            "duration_s": s.duration_s, "rounds": s.rounds, "tasks_planned": s.tasks_planned,
            "tasks_committed": s.tasks_committed, "preempted_commits": s.preempted_commits,
            "tasks_preempted": s.tasks_preempted, "lock_held_s": s.lock_held_s, "error": s.error,
            "fragments_after": s.health_after["fragments"], "merges_during": len(during),
            "merge_s_median": during[len(during) // 2] if during else None, "merge_s_max": max(during, default=None)}
        name = "lock" if use_lock else "no lock"
        log(f"compaction under merges ({name}): {json.dumps(out[name])}")
        shutil.rmtree(path)
    return out


def _ratio(name: str, value: float, target: str | None = None, ok: bool | None = None) -> str:
    tail = f"   (target {target}: {'met' if ok else 'NOT met'})" if target else ""
    return f"ratio {name}: {value:.2f}{tail}"


def report(results: dict) -> None:
    for mode in ("on", "off"):
        if mode not in results:
            continue
        pts = results[mode]["points"]
        print(f"\nretention and compaction {mode.upper()} ({results[mode]['total_s']:.0f} s for all cycles)")
        print("  cycle  fragments  versions  base bytes   _mem_wal bytes  gen dirs  merge s  merge peak RSS MiB")
        for c, p in sorted(pts.items(), key=lambda kv: int(kv[0])):
            print(f"  {int(c):5d}  {p['fragments']:9d}  {p['table_versions']:8d}  {p['base_bytes']:11d}  "
                  f"{p['mem_wal_bytes']:14d}  {p['generation_dirs']:8d}  {p['merge_s']:7.2f}  {p['peak_rss_mb']:8.0f}")
        first, last = pts[min(pts, key=int)], pts[max(pts, key=int)]
        for key, target, limit in (("base_bytes", "<= 1.2", 1.2), ("mem_wal_bytes", "<= 1.2", 1.2),
                                   ("fragments", "<= 1.2", 1.2), ("table_versions", "<= 1.2", 1.2),
                                   ("merge_s", "<= 1.15", 1.15), ("peak_rss_mb", "<= 1.15", 1.15)):
            r = last[key] / first[key] if first[key] else float("inf")
            label = f"{mode}: {key} cycle {max(pts, key=int)} / cycle {min(pts, key=int)}"
            print("  " + (_ratio(label, r, target, r <= limit) if mode == "on" else _ratio(label + " (growth)", r)))
    for policy in POLICIES:
        if f"vector-{policy}" not in results:
            continue
        pts = results[f"vector-{policy}"]["points"]
        total = results[f"vector-{policy}"]["total_s"]
        print(f"\nIVF_PQ + FTS table, segments {policy} ({total:.0f} s for all cycles)")
        print("  cycle  fragments  vec segments  fts segments  base bytes   merge s  catch-up s  ANN ms  FTS ms")
        for c, p in sorted(pts.items(), key=lambda kv: int(kv[0])):
            print(f"  {int(c):5d}  {p['fragments']:9d}  {p['vec_segments']:12d}  {p['text_segments']:12d}  "
                  f"{p['base_bytes']:11d}  {p['merge_s']:7.2f}  {p['catchup_s']:10.2f}  {p['ann_ms']:6.1f}  "
                  f"{p['fts_ms']:6.1f}")
        first, last = pts[min(pts, key=int)], pts[max(pts, key=int)]
        for key in ("fragments", "vec_segments", "text_segments", "base_bytes", "merge_s", "ann_ms", "fts_ms"):
            r = last[key] / first[key] if first[key] else float("inf")
            label = f"vector {policy}: {key} cycle {max(pts, key=int)} / cycle {min(pts, key=int)}"
            targeted = policy == "folded" and key not in ("ann_ms", "fts_ms")
            print("  " + (_ratio(label, r, "<= 1.2", r <= 1.2) if targeted else _ratio(label + " (growth)", r)))
    if "spark" in results:
        s = results["spark"]
        print(f"\ncompaction of a {results['settings']['fragments']}-fragment table: in process "
              f"{s['in_process']['duration_s']:.2f} s ({s['in_process']['tasks']} tasks), Spark local[2] "
              f"{s['local[2]']['duration_s']:.2f} s (wall {s['local[2]']['wall_s']:.2f} s with start-up); equal: "
              f"{s['equal']}")
        print("  " + _ratio("compaction in process / Spark local[2] (job durations)",
                            s["in_process"]["duration_s"] / s["local[2]"]["duration_s"]))


def report_contention(c: dict) -> None:
    print("\ncompaction while another process merges in a loop (random upserts: deletion vectors in most fragments)")
    for name, r in c.items():
        print(f"  {name:8s} {r['duration_s']:6.2f} s, {r['rounds']} rounds, "
              f"{r['tasks_committed']}/{r['tasks_planned']} tasks committed, {r['preempted_commits']} commits "
              f"preempted ({r['tasks_preempted']} tasks), fragments after {r['fragments_after']}; lock held "
              f"{r['lock_held_s']:.2f} s; {r['merges_during']} merges meanwhile (median "
              f"{r['merge_s_median'] or 0:.2f} s, max {r['merge_s_max'] or 0:.2f} s)"
              + (f"; {r['error']}" if r["error"] else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--rows", type=int, default=25_000, help="upserts per region and cycle")
    p.add_argument("--measure-at", default="10,20,40", help="cycles at which everything is measured")
    p.add_argument("--modes", default="on,off")
    p.add_argument("--vector-cycles", type=int, default=40, help="cycles of the IVF_PQ + FTS table (0: none)")
    p.add_argument("--vector-base-rows", type=int, default=200_000)
    p.add_argument("--vector-regions", type=int, default=2)
    p.add_argument("--vector-rows", type=int, default=10_000, help="upserts per region and cycle, vector table")
    p.add_argument("--vector-policies", default="folded,unfolded")
    p.add_argument("--fragments", type=int, default=64)
    p.add_argument("--rows-per-fragment", type=int, default=100_000)
    p.add_argument("--target-rows", type=int, default=400_000, help="compaction target on the 64-fragment table")
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument("--skip-contention", action="store_true")
    p.add_argument("--merger-child", nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--scaling", action="store_true",
                   help="also run issue 10's scaling (bench/maintenance.py: 16 regions x 4 x 300,000 rows)")
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--merge-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.merge_child:
        return merge_child(args.merge_child)
    if args.merger_child:
        return merger_child(*args.merger_child)
    work = tempfile.mkdtemp(prefix="bench-health-", dir=args.dir)
    results: dict = {"settings": vars(args), "lance": lance.__version__}
    try:
        for mode in [m for m in args.modes.split(",") if m]:
            log(f"cycles with retention and compaction {mode}")
            results[mode] = run_cycles(work, mode == "on", args.cycles, {int(x) for x in args.measure_at.split(",")},
                                       args.base_rows, args.regions, args.rows, 7)
        for policy in [x for x in args.vector_policies.split(",") if x] if args.vector_cycles else []:
            log(f"cycles of the IVF_PQ + FTS table, segments {policy}")
            results[f"vector-{policy}"] = run_vector_cycles(
                work, policy, args.vector_cycles, {int(x) for x in args.measure_at.split(",")},
                args.vector_base_rows, args.vector_regions, args.vector_rows, 11)
        if not args.skip_spark:
            log(f"compaction of a {args.fragments}-fragment table: in process, then Spark local[2]")
            results["spark"] = compaction_on_spark(work, args.fragments, args.rows_per_fragment, args.target_rows)
        if not args.skip_contention:
            log("compaction while another process merges in a loop, without and with the MemWAL index lock")
            results["contention"] = compaction_under_merges(work, args.fragments, args.rows_per_fragment,
                                                            args.target_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results)
    if "contention" in results:
        report_contention(results["contention"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2, default=str)
    if args.scaling:
        log("issue 10's scaling: bench/maintenance.py, 16 regions x 4 generations x 300,000 rows, local[1] vs [2]")
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "maintenance.py"), "--regions", "",
                        "--scaling-regions", "16", "--generations", "4", "--gen-rows", "300000",
                        "--base-rows", "2000000", "--scaling-repeat", "1", "--skip-standalone", "--skip-large",
                        *(["--dir", args.dir] if args.dir else [])], check=True)


if __name__ == "__main__":
    main()
