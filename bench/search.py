"""Vector search over the LSM view (issue 33): our `LsmReader.search` against a brute-force newest-wins truth,
the base-table ANN alone on a fully merged and caught-up copy, Lance core's LsmVectorSearchPlanner and
LanceDB 0.40's LSM query.

Table A: `--base-rows` vectors (dim `--dim`, IVF_PQ) in 256 clusters, each spread over 8 dimensions
(isotropic noise in all 128 would leave every row of a cluster about equally far: no meaningful
neighbours), MemWAL maintaining the index; our writer flushes `--gap + --unmerged` generations of
`--gen-rows` rows (half updates of base keys with new vectors, half new keys); our merge merges the first
`--gap` of them without index catch-up (their rows sit in unindexed base fragments). Copy B: A after
catch-up (no gap, the same unmerged generations). Copy C: A fully merged and caught up (the base-table ANN
alone serves the same view). Copy D: C with its vector index trained afresh (catch-up's optimize_indices
leaves a one-partition IVF_PQ, so C's base ANN is not what a fresh index gives); printed beside C.
Truth: exact L2 top-k over the view's newest rows. Latency: p50 over `--repeat` rounds of the queries, warm,
all contestants timed interleaved (each query runs every contestant in turn: the load falls on all alike).
`--equal-recall`: then, per recall target, the cheapest settings of ours (A) and of the base ANN alone (C) that
reach it and their p50 ratio (bench/search_equal_recall.py); `--equal-recall-only` skips D, the peers and the
fixed-settings table, keeping the gap ratio (A / B at `--nprobes` / `--refine`, timed interleaved).
`--dir` holding a.lance, b.lance and c.lance from an earlier run: reused, not rebuilt.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
from search_equal_recall import recall, timed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, os.path.join(REPO, "tests"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rows(ids: np.ndarray, vecs: np.ndarray) -> pa.Table:
    from support.tables import PK

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK),
                        pa.field("vec", pa.list_(pa.float32(), vecs.shape[1]))])
    flat = pa.array(vecs.astype("float32").ravel(), pa.float32())
    return pa.table({"id": pa.array(ids, pa.int64()), "vec": pa.FixedSizeListArray.from_arrays(flat, vecs.shape[1])},
                    schema=schema)


def build(uri: str, args: argparse.Namespace, rng: np.random.Generator, centers: np.ndarray) -> str:
    import lance

    from memwal.writer import RegionWriter

    from support.maintenance import ONE_GEN_PER_FLUSH, merge_region

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


def equal_recall_table(args: argparse.Namespace, reader_a, base_c, queries: np.ndarray, truth: list) -> None:
    """The equal-recall comparison: ours on A against the base ANN alone on C (caught up)."""
    from search_equal_recall import equal_recall

    from memwal.search_plan import index_partitions, source_index

    def ours(q, nprobes, refine):
        return reader_a.search(q, k=args.k, columns=["id"], nprobes=nprobes, refine_factor=refine
                               ).column("id").to_pylist()

    def base(q, nprobes, refine):
        return base_c.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": args.k, "nprobes": nprobes,
                                                        "refine_factor": refine},
                               disable_scoring_autoprojection=True).column("id").to_pylist()

    index = source_index(reader_a, 0, "vec", lambda d, col: d.name == "vec_idx")
    partitions = index_partitions(reader_a, 0, index)
    equal_recall({"ours (A)": ours, "base ANN alone (C)": base}, queries, truth, args.k, partitions, args.repeat)


def equal_recall_only(args: argparse.Namespace, reader_a, reader_b, base_c, queries: np.ndarray, truth: list,
                      vecs: np.ndarray, rng: np.random.Generator) -> None:
    """The gap ratio (A / B, same settings, timed interleaved) and the equal-recall comparison."""

    def ours(reader):
        return lambda q: reader.search(q, k=args.k, columns=["id"], nprobes=args.nprobes,
                                       refine_factor=args.refine).column("id").to_pylist()

    print(f"base {args.base_rows} rows; {args.queries} queries, k={args.k}")
    got_a, got_b = [ours(reader_a)(q) for q in queries], [ours(reader_b)(q) for q in queries]
    ms_a, ms_b = timed([ours(reader_a), ours(reader_b)], queries, args.repeat)
    print(f"ours nprobes {args.nprobes} refine {args.refine}: A recall {recall(got_a, truth, args.k):.3f} "
          f"p50 {ms_a:.2f} ms; B (no gap) recall {recall(got_b, truth, args.k):.3f} p50 {ms_b:.2f} ms; "
          f"A / B {ms_a / ms_b:.2f} (target <= 1.1)")
    first_query(args, reader_a.store.uri, queries)
    first_after_flush(args, reader_a.store.uri, vecs, queries, rng)
    equal_recall_table(args, reader_a, base_c, queries, truth)


def _first_and_p50(args: argparse.Namespace, uri: str, queries: np.ndarray, rounds: int, before=None
                   ) -> tuple[float, float]:
    """Per round: before(round) (if given), a new LsmReader of `uri`, its first search timed, then every query;
    the median first search and the p50 of the rest (ms)."""
    from memwal.reader import LsmReader

    def search(reader, q):
        return reader.search(q, k=args.k, columns=["id"], nprobes=args.nprobes, refine_factor=args.refine)

    firsts, rest = [], []
    for i in range(rounds):
        if before is not None:
            before(i)
        reader = LsmReader(uri)
        t = time.perf_counter()
        search(reader, queries[i % len(queries)])
        firsts.append((time.perf_counter() - t) * 1000)
        for q in queries:
            t = time.perf_counter()
            search(reader, q)
            rest.append((time.perf_counter() - t) * 1000)
    return float(np.median(firsts)), float(np.median(rest))


def first_query(args: argparse.Namespace, uri: str, queries: np.ndarray, snapshots: int = 5) -> None:
    """A new snapshot's first search against the p50 of the searches after it: per round a new LsmReader of A
    (its read plan and flat block are built anew; the process's caches stay warm)."""
    first, p50 = _first_and_p50(args, uri, queries, snapshots)
    print(f"a new snapshot's first search (median of {snapshots}): {first:.1f} ms; p50 after it {p50:.2f} ms; "
          f"first / p50 {first / p50:.1f}")


def first_after_flush(args: argparse.Namespace, uri: str, vecs: np.ndarray, queries: np.ndarray,
                      rng: np.random.Generator, rounds: int = 5) -> None:
    """A new snapshot's first search after a flush against the p50 of the searches after it, on a copy of A: per
    round one generation of `--flush-rows` rows (new keys, vectors near the table's) is flushed and a new
    LsmReader opened, as a service does after a flush (what was read of the older generations stays read)."""
    from memwal.reader import LsmReader
    from memwal.writer import RegionWriter

    from support.maintenance import ONE_GEN_PER_FLUSH

    copy = uri.rstrip("/") + "-flushes"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(uri, copy)
    with RegionWriter(copy, str(uuid.uuid4()), config=ONE_GEN_PER_FLUSH) as w:
        LsmReader(copy).search(queries[0], k=args.k)  # the process has read the table once, as a service has

        def flush(i: int) -> None:
            near = vecs[rng.choice(len(vecs), args.flush_rows)] + 0.1 * rng.standard_normal((args.flush_rows, args.dim))
            w.put(rows(np.arange((1 << 40) + i * args.flush_rows, (1 << 40) + (i + 1) * args.flush_rows), near))
            w.flush()

        first, p50 = _first_and_p50(args, copy, queries, rounds, before=flush)
    shutil.rmtree(copy, ignore_errors=True)
    print(f"a new snapshot's first search after a flush of {args.flush_rows} rows (median of {rounds}): "
          f"{first:.1f} ms; p50 after it {p50:.2f} ms; first / p50 {first / p50:.1f}")


def retrain(uri: str, index: str) -> None:
    """Index `index` of the table at `uri` trained afresh by the rule of A's base index (sqrt(rows) partitions,
    dim / 8 sub-vectors). Copy D: pylance 14.0.2's optimize_indices (which catch-up runs) leaves an IVF_PQ reporting one
    partition (bench/README.md), so C's index is not the base-table ANN a fresh build would give."""
    import lance

    ds = lance.dataset(uri)
    n = ds.count_rows()
    ds.create_index("vec", "IVF_PQ", name=index, replace=True, num_partitions=max(4, int(math.sqrt(n))),
                    num_sub_vectors=ds.schema.field("vec").type.list_size // 8)


def unindexed_fragments(ds, index: str) -> list:
    """The fragments of `ds` that no segment of `index` covers (the merged-not-caught-up rows on table A)."""
    covered: set[int] = set()
    for d in ds.list_indices():
        if d["name"] == index:
            covered |= set(d["fragment_ids"])
    return [f for f in ds.get_fragments() if f.fragment_id not in covered]


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
    p.add_argument("--flush-rows", type=int, default=1000,
                   help="rows of each generation flushed before a new snapshot's first search is timed")
    p.add_argument("--dir", default=None, help="work directory (default: a new temporary one, removed after)")
    p.add_argument("--equal-recall", action="store_true", help="also the equal-recall comparison")
    p.add_argument("--equal-recall-only", action="store_true", help="only the gap ratio and the equal-recall one")
    args = p.parse_args()

    import lance
    from lancedb_client import LanceDbClient

    from memwal.catchup import catchup_table
    from memwal.merge import merge_table
    from memwal.reader import LsmReader

    from support.tables import lance_core_snapshots

    root = args.dir or tempfile.mkdtemp(prefix="memwal-search-bench-")
    rng = np.random.default_rng(33)
    centers = rng.standard_normal((256, args.dim)) * 3
    # `<name>.lance` in one directory: LanceDB opens them as tables "a", "b", "c" of that database.
    a, b, c = (os.path.join(root, f"{x}.lance") for x in ("a", "b", "c"))
    if all(os.path.isdir(x) for x in (a, b, c)):
        log(f"reusing A, B and C in {root}")
    else:
        build(a, args, rng, centers)
        shutil.copytree(a, b)
        shutil.copytree(a, c)
        catchup_table(b)
        merge_table(c)
        catchup_table(c)
        log("copies B (caught up) and C (merged and caught up) ready")
    d = os.path.join(root, "d.lance")
    if not args.equal_recall_only and not os.path.isdir(d):
        shutil.copytree(c, d)
        retrain(d, "vec_idx")
        log("copy D (C with its vector index retrained) ready")

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
    if args.equal_recall_only:
        equal_recall_only(args, reader_a, reader_b, lance.dataset(c), queries, truth, vecs, rng)
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
        return
    base_c, base_d = lance.dataset(c), lance.dataset(d)
    ds_a = lance.dataset(a)
    gap_fragments = unindexed_fragments(ds_a, "vec_idx")
    snapshots = lance_core_snapshots(SimpleNamespace(uri=a, storage_options=None))
    planner = lance.LsmVectorSearchPlanner(ds_a, snapshots, "vec")
    lancedb_a = LanceDbClient(root, "a")

    def ours(reader, **kw):
        return lambda q: reader.search(q, k=k, columns=["id"], **kw).column("id").to_pylist()

    def base(ds=base_c, **kw):
        return lambda q: ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": k, **kw}
                                     ).column("id").to_pylist()

    # What serving the gap costs with no index at all. Lance refuses a KNN over chosen fragments and reads every
    # fragment for a `_rowaddr` filter, so its rows are copied into a table of their own and searched flat there;
    # and, as ours holds a small flat source, as an in-memory matrix product.
    gap_rows_table = pa.concat_tables([f.to_table(columns=["id", "vec"]) for f in gap_fragments]) \
        if gap_fragments else rows(np.zeros(0, np.int64), np.zeros((0, args.dim)))
    gap_ds = lance.write_dataset(gap_rows_table, os.path.join(root, "gap.lance"), mode="overwrite")
    gap_ids = gap_rows_table.column("id").to_numpy()
    gap_vecs = np.asarray(gap_rows_table.column("vec").combine_chunks().flatten(), np.float32).reshape(-1, args.dim)

    def gap_flat(q):
        return gap_ds.to_table(columns=["id"], nearest={"column": "vec", "q": q, "k": k, "use_index": False}
                               ).column("id").to_pylist()

    def gap_numpy(q):
        return gap_ids[np.argsort(((gap_vecs - q) ** 2).sum(axis=1))[:k]].tolist()

    def lance_core(overfetch: float):
        return lambda q: planner.plan_search(pa.array(q), k=k, nprobes=args.nprobes, columns=["id"],
                                             overfetch_factor=overfetch).to_table().column("id").to_pylist()

    def lancedb(**kw):
        return lambda q: lancedb_a.vector_ids(q, k, **kw)

    settings = f"nprobes {args.nprobes} refine {args.refine}"
    names = SimpleNamespace(
        ours_default="ours, defaults (A)", base_default="base ANN alone, defaults (C)",
        ours=f"ours, {settings} (A)", base=f"base ANN alone, {settings} (C)",
        base_d_default="base ANN alone, defaults, retrained (D)", base_d=f"base ANN alone, {settings}, retrained (D)",
        ours_b=f"ours, {settings}, no gap (B)", ours_default_b="ours, defaults, no gap (B)",
        gap_flat=f"gap alone, Lance flat KNN ({gap_rows_table.num_rows} rows, {len(gap_fragments)} fragments of A)",
        gap_numpy="gap alone, flat in memory (numpy)",
        core1=f"Lance core planner, nprobes {args.nprobes}, over-fetch 1.0 (A)",
        core10=f"Lance core planner, nprobes {args.nprobes}, over-fetch 10 (A)",
        lancedb_default="LanceDB 0.40 LSM query, defaults (A)", lancedb=f"LanceDB 0.40 LSM query, {settings} (A)")
    contestants = [
        (names.ours_default, ours(reader_a)),
        (names.base_default, base()),
        (names.ours, ours(reader_a, **tuned)),
        (names.base, base(**tuned)),
        (names.base_d_default, base(base_d)),
        (names.base_d, base(base_d, **tuned)),
        (names.ours_b, ours(reader_b, **tuned)),
        (names.ours_default_b, ours(reader_b)),
        (names.gap_flat, gap_flat),
        (names.gap_numpy, gap_numpy),
        (names.core1, lance_core(1.0)),
        (names.core10, lance_core(10.0)),
        (names.lancedb_default, lancedb()),
        (names.lancedb, lancedb(**tuned)),
    ]
    print(f"base {args.base_rows} rows dim {args.dim}; {args.unmerged} unmerged + {args.gap} merged-not-caught-up "
          f"generations of {args.gen_rows} rows; {len(ids)} live rows; {args.queries} queries, k={k}")
    figures: dict[str, tuple[float, float]] = {}
    width = max(len(n) for n, _ in contestants)
    answers, alive = {}, []
    for name, fn in contestants:  # the answers (and a warm-up); a contestant that fails is left out
        try:
            answers[name] = [fn(q) for q in queries]
            alive.append((name, fn))
        except Exception as exc:
            print(f"{name:{width}s} failed: {str(exc).splitlines()[0][:100]}")
    # Timed interleaved: each query runs every contestant in turn, so the machine's load falls on all alike.
    p50s = dict(zip([n for n, _ in alive], timed([fn for _, fn in alive], queries, args.repeat), strict=True))
    for name, fn in alive:
        got, ms = answers[name], p50s[name]
        if fn in (gap_flat, gap_numpy):  # a part of the view, not an answer: its recall means nothing
            figures[name] = (float("nan"), ms)
            print(f"{name:{width}s} recall@{k}   -    p50 {ms:7.2f} ms")
            continue
        short = sum(len(g) < k for g in got)
        figures[name] = (recall(got, truth, k), ms)
        print(f"{name:{width}s} recall@{k} {figures[name][0]:.3f}  p50 {ms:7.2f} ms  short {short} of {len(got)}")
        if fn is contestants[0][1]:
            plan = reader_a.last_vector_plan
            print(f"  ours on A: {plan.indexed_sources} sources through an index, {plan.flat_sources} flat, "
                  f"{plan.rows_served_flat} rows served flat")
    lancedb_a.close()
    print_ratios(figures, names, k)
    first_query(args, a, queries)
    first_after_flush(args, a, vecs, queries, rng)
    if args.equal_recall:
        equal_recall_table(args, reader_a, base_c, queries, truth)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


def print_ratios(figures: dict[str, tuple[float, float]], names: SimpleNamespace, k: int) -> None:
    """The issue's ratios (and the peers' beside them), each from this run's figures, with its target."""
    def recall_of(name: str) -> float | None:
        return figures[name][0] if name in figures else None

    def line(label: str, value: float | None, fmt: str, target: str = "") -> None:
        shown = "n/a (a contestant failed)" if value is None else format(value, fmt)
        print(f"  {label:62s} {shown}{'  (target ' + target + ')' if target else ''}")

    def diff(x: str, y: str) -> float | None:
        return figures[x][0] - figures[y][0] if x in figures and y in figures else None

    def ratio(x: str, y: str) -> float | None:
        return figures[x][1] / figures[y][1] if x in figures and y in figures else None

    print("ratios (this run):")
    line(f"recall@{k} ours at defaults (A)", recall_of(names.ours_default), ".3f", ">= 0.95")
    line("recall ours - base alone, same settings (A vs C)", diff(names.ours, names.base), "+.3f", ">= -0.02")
    line("  Lance core planner over-fetch 1.0 - base alone", diff(names.core1, names.base), "+.3f")
    line("  Lance core planner over-fetch 10 - base alone", diff(names.core10, names.base), "+.3f")
    line("  LanceDB LSM query - base alone, same settings", diff(names.lancedb, names.base), "+.3f")
    line("  against D (C's vector index retrained): ours - base alone", diff(names.ours, names.base_d), "+.3f")
    line("p50 ours / base alone, same settings (A / C)", ratio(names.ours, names.base), ".2f", "<= 2")
    line("  Lance core planner over-fetch 1.0 / base alone", ratio(names.core1, names.base), ".2f")
    line("  LanceDB LSM query / base alone, same settings", ratio(names.lancedb, names.base), ".2f")
    line("  against D (C's vector index retrained): ours / base alone", ratio(names.ours, names.base_d), ".2f")
    line("p50 ours with the gap / without, same settings (A / B)", ratio(names.ours, names.ours_b), ".2f", "<= 1.2")
    line("p50 ours with the gap / without, defaults (A / B)", ratio(names.ours_default, names.ours_default_b), ".2f",
         "<= 1.2")
    line("  gap alone, Lance flat KNN / ours without the gap (B)", ratio(names.gap_flat, names.ours_b), ".2f")
    line("  gap alone, flat in memory / ours without the gap (B)", ratio(names.gap_numpy, names.ours_b), ".2f")


if __name__ == "__main__":
    main()
