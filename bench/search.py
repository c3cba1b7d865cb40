"""Vector search over the LSM view (issue 33): our `LsmReader.search` against a brute-force newest-wins truth,
the base-table ANN alone on a fully merged and caught-up copy, and Lance core's LsmVectorSearchPlanner.

Table A: `--base-rows` vectors (dim `--dim`, IVF_PQ) in 256 clusters, each spread over 8 dimensions
(isotropic noise in all 128 would leave every row of a cluster about equally far: no meaningful
neighbours), MemWAL maintaining the index; our writer flushes `--gap + --unmerged` generations of
`--gen-rows` rows (half updates of base keys with new vectors, half new keys); our merge merges the first
`--gap` of them without index catch-up (their rows sit in unindexed base fragments). Copy B: A after
catch-up (no gap, the same unmerged generations). Copy C: A fully merged and caught up (the base-table ANN
alone serves the same view).
Truth: exact L2 top-k over the view's newest rows. Latency: p50 over `--repeat` rounds of the queries, warm.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, os.path.join(REPO, "tests"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rows(ids: np.ndarray, vecs: np.ndarray) -> pa.Table:
    from tables import PK

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK),
                        pa.field("vec", pa.list_(pa.float32(), vecs.shape[1]))])
    flat = pa.array(vecs.astype("float32").ravel(), pa.float32())
    return pa.table({"id": pa.array(ids, pa.int64()), "vec": pa.FixedSizeListArray.from_arrays(flat, vecs.shape[1])},
                    schema=schema)


def build(uri: str, args: argparse.Namespace, rng: np.random.Generator, centers: np.ndarray) -> str:
    import lance
    from maintenance import ONE_GEN_PER_FLUSH, merge_region

    from memwal.writer import RegionWriter

    mix = rng.standard_normal((8, args.dim))  # rows near an 8-dimensional surface: neighbours are meaningful

    def draw(n: int) -> np.ndarray:
        return centers[rng.integers(0, len(centers), n)] + rng.standard_normal((n, 8)) @ mix

    n = args.base_rows
    ds = lance.write_dataset(rows(np.arange(n), draw(n)), uri, max_rows_per_file=1 << 20)
    log(f"base written: {n} rows")
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=max(4, int(math.sqrt(n))),
                    num_sub_vectors=args.dim // 8)
    log("IVF_PQ built")
    lance.dataset(uri).initialize_mem_wal(maintained_indexes=["vec_idx"], unsharded=True)
    region = str(uuid.uuid4())
    next_id = n
    with RegionWriter(uri, region, config=ONE_GEN_PER_FLUSH) as w:
        for _ in range(args.gap + args.unmerged):
            half = args.gen_rows // 2
            ids = np.concatenate([rng.choice(next_id, half, replace=False), np.arange(next_id, next_id + half)])
            next_id += half
            w.put(rows(ids, draw(len(ids))))
            w.flush()
    log(f"{args.gap + args.unmerged} generations flushed")
    if args.gap:
        merge_region(uri, None, region, up_to_generation=args.gap)
    log(f"{args.gap} generations merged, not caught up")
    return region


def p50(fn, queries: np.ndarray, repeat: int) -> tuple[list, float]:
    results = [fn(q) for q in queries]  # warm-up round, and the results
    times = []
    for _ in range(repeat):
        for q in queries:
            t = time.perf_counter()
            fn(q)
            times.append(time.perf_counter() - t)
    return results, statistics.median(times) * 1000


def recall(results: list, truth: list, k: int) -> float:
    return float(np.mean([len(set(r) & set(t)) / k for r, t in zip(results, truth, strict=True)]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--gen-rows", type=int, default=5000)
    p.add_argument("--unmerged", type=int, default=8)
    p.add_argument("--gap", type=int, default=4)
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--nprobes", type=int, default=20)
    p.add_argument("--refine", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None, help="work directory (default: a new temporary one, removed after)")
    args = p.parse_args()

    import lance
    from tables import lance_core_snapshots

    from memwal.catchup import catchup_table
    from memwal.merge import merge_table
    from memwal.reader import LsmReader

    root = args.dir or tempfile.mkdtemp(prefix="memwal-search-bench-")
    rng = np.random.default_rng(33)
    centers = rng.standard_normal((256, args.dim)) * 3
    a, b, c = (os.path.join(root, x) for x in ("a", "b", "c"))
    build(a, args, rng, centers)
    shutil.copytree(a, b)
    shutil.copytree(a, c)
    catchup_table(b)
    merge_table(c)
    catchup_table(c)
    log("copies B (caught up) and C (merged and caught up) ready")

    view = LsmReader(a).scan(columns=["id", "vec"])
    ids = view.column("id").to_numpy()
    vecs = np.asarray(view.column("vec").combine_chunks().flatten(), np.float32).reshape(-1, args.dim)
    queries = vecs[rng.choice(len(vecs), args.queries, replace=False)] + 0.1 * rng.standard_normal(
        (args.queries, args.dim)).astype("float32")
    norms = (vecs ** 2).sum(axis=1)
    truth = [ids[np.argsort(norms - 2 * vecs @ q)[:args.k]].tolist() for q in queries]
    log(f"truth over {len(ids)} live rows")

    k, tuned = args.k, {"nprobes": args.nprobes, "refine_factor": args.refine}
    reader_a, reader_b = LsmReader(a), LsmReader(b)
    base_c = lance.dataset(c)
    ds_a = lance.dataset(a)
    snapshots = lance_core_snapshots(SimpleNamespace(uri=a, storage_options=None))
    planner = lance.LsmVectorSearchPlanner(ds_a, snapshots, "vec")

    def ours(reader, **kw):
        return lambda q: reader.search(q, k=k, columns=["id"], **kw).column("id").to_pylist()

    def base(**kw):
        return lambda q: base_c.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": k, **kw}
                                         ).column("id").to_pylist()

    def lance_core(overfetch: float):
        return lambda q: planner.plan_search(pa.array(q), k=k, nprobes=args.nprobes, columns=["id"],
                                             overfetch_factor=overfetch).to_table().column("id").to_pylist()

    contestants = [
        ("ours, defaults (A)", ours(reader_a)),
        ("base ANN alone, defaults (C)", base()),
        (f"ours, nprobes {args.nprobes} refine {args.refine} (A)", ours(reader_a, **tuned)),
        (f"base ANN alone, nprobes {args.nprobes} refine {args.refine} (C)", base(**tuned)),
        (f"ours, nprobes {args.nprobes} refine {args.refine}, no gap (B)", ours(reader_b, **tuned)),
        (f"Lance core planner, nprobes {args.nprobes}, over-fetch 1.0 (A)", lance_core(1.0)),
        (f"Lance core planner, nprobes {args.nprobes}, over-fetch 10 (A)", lance_core(10.0)),
    ]
    print(f"base {args.base_rows} rows dim {args.dim}; {args.unmerged} unmerged + {args.gap} merged-not-caught-up "
          f"generations of {args.gen_rows} rows; {args.queries} queries, k={k}")
    figures = {}
    for name, fn in contestants:
        try:
            got, ms = p50(fn, queries, args.repeat)
        except Exception as exc:
            print(f"{name:58s} failed: {str(exc).splitlines()[0][:100]}")
            continue
        short = sum(len(g) < k for g in got)
        figures[name] = (recall(got, truth, k), ms)
        print(f"{name:58s} recall@{k} {figures[name][0]:.3f}  p50 {ms:7.2f} ms  short {short}")
    plan = reader_a.last_vector_plan
    print(f"ours on A: {plan.indexed_sources} sources through an index, {plan.flat_sources} flat, "
          f"{plan.rows_served_flat} rows served flat")
    names = [n for n, _ in contestants]
    if names[2] in figures and names[3] in figures:
        print(f"recall ours - base (tuned): {figures[names[2]][0] - figures[names[3]][0]:+.3f}; "
              f"latency ours / base (tuned): {figures[names[2]][1] / figures[names[3]][1]:.2f}x")
    if names[2] in figures and names[4] in figures:
        print(f"latency with the gap / without: {figures[names[2]][1] / figures[names[4]][1]:.2f}x")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
