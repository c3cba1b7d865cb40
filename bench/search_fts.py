"""Full-text search over the LSM view (issue 33): our `LsmReader.full_text_search` (one global BM25) against
global BM25 computed from the newest rows, LanceDB's LSM FTS printed beside, latency against base-only FTS.

Table (written by LanceDB 0.40 with an unsharded LSM write spec maintaining its FTS index, so both readers
see the same files): `--base-rows` base rows, then `--generations` LanceDB flushes of `--gen-rows` rows each
(half updates of base keys, half new keys); our merge then merges the first `--merged` of them into the base
without index catch-up (their rows sit in unindexed base fragments). Skewed: the base texts draw from one
Zipf vocabulary, the generations' from the same words in reverse order, so a term common in one source is
rare in the other and per-source BM25 statistics rank differently from the view's.
Truth: BM25 (Lance's k1, b, idf) over the LSM view's newest texts, analysed by tests/fts_model.py (written
apart from memwal.fts_tokenizer). Overlap@10 counts returned keys whose true score reaches the true 10th.
Latency: p50 of `--repeat` rounds over the queries: ours on a warm reader (the first query, which counts
the view's terms, reported apart), Lance's FTS on the base table alone (limit 10), LanceDB's LSM FTS.
Then the streaming case (issue 44): `--flushes` times, LanceDB flushes one more generation of `--flush-rows`
rows (half updates of live keys) from a writer process of its own, a new reader opens (a new snapshot, same
process) and its first query is timed against its own p50 over the queries; the median ratio, and the
overlap with the global BM25 of the view after the last flush. Last, the generations are merged into a new
base version and a new reader's first query is timed the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, os.path.join(REPO, "tests"))

VOCAB = [f"{a}{b}" for a in ("bar", "cor", "del", "fin", "gal", "hor", "jun", "kel") for b in
         ("ap", "eb", "ic", "od", "ul", "ym", "ax", "ev", "ir", "on", "us", "et", "ik", "ob", "uz", "ah")]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def texts(rng: np.random.Generator, n: int, reverse: bool) -> list[str]:
    """n texts of 3-14 words from a Zipf(1.1) ranking of VOCAB (reversed for the generations)."""
    words = VOCAB[::-1] if reverse else VOCAB
    p = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    p /= p.sum()
    lengths = rng.integers(3, 15, n)
    picks = rng.choice(len(words), int(lengths.sum()), p=p)
    out, at = [], 0
    for n_words in lengths:
        out.append(" ".join(words[i] for i in picks[at:at + n_words]))
        at += n_words
    return out


SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("text", pa.string())])


def batch(ids, text_list) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "text": pa.array(text_list, pa.string())}, schema=SCHEMA)


def flush(root: str, table: pa.Table) -> None:
    """One LanceDB LSM write of `table` (upserts by id), flushed as one generation when its writers close."""
    import lancedb

    async def write():
        t = await (await lancedb.connect_async(root)).open_table("t")
        await t.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(table)
        await t.close_lsm_writers()

    asyncio.run(write())


def flush_apart(root: str, table: pa.Table) -> None:
    """flush() in a writer process of its own, as a streaming writer runs: LanceDB's first write in a process
    starts its runtime and loads the table's indexes, which would otherwise slow the reader's next queries."""
    import subprocess

    import pyarrow.feather as feather

    path = os.path.join(root, "flush-batch.arrow")
    feather.write_feather(table, path)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--flush-into", root, path], check=True)
    os.remove(path)


def build(root: str, args) -> tuple[str, dict[int, str]]:
    """The LanceDB table and the model of its LSM view (key -> newest text)."""
    import lancedb
    from lancedb import LsmWriteSpec

    from memwal.merge import merge_table

    rng = np.random.default_rng(7)
    model = dict(enumerate(texts(rng, args.base_rows, False)))
    next_id = args.base_rows

    async def create(db):
        t = await db.create_table("t", batch(model.keys(), list(model.values())))
        await t.create_index("text", name="text_idx", config=lancedb.index.FTS())
        await t.set_unenforced_primary_key("id")
        await t.set_lsm_write_spec(LsmWriteSpec.unsharded().with_maintained_indexes(["text_idx"]))

    async def run(fn, *a):
        return await fn(await lancedb.connect_async(root), *a)

    asyncio.run(run(create))
    for g in range(args.generations):
        updates = rng.choice(args.base_rows, args.gen_rows // 2, replace=False).tolist()
        ids = updates + list(range(next_id, next_id + args.gen_rows - len(updates)))
        next_id += args.gen_rows - len(updates)
        new = texts(rng, len(ids), True)
        flush(root, batch(ids, new))
        model.update(zip(ids, new, strict=True))
        log(f"generation {g + 1} written")
    uri = os.path.join(root, "t.lance")
    if args.merged:
        summary = merge_table(uri, up_to_generation=args.merged)
        assert not summary.failed_regions, summary
    return uri, model


class Truth:
    """Global BM25 over the model's texts (tests/fts_model.py's analysis)."""

    def __init__(self, model: dict[int, str]):
        from support.fts_model import terms_of

        self.terms_of = terms_of
        self.docs = {k: Counter(terms_of(t)) for k, t in model.items()}
        self.lengths = {k: sum(c.values()) for k, c in self.docs.items()}
        self.n = sum(1 for v in self.lengths.values() if v)
        self.avg = sum(self.lengths.values()) / self.n
        self.df = Counter(t for c in self.docs.values() for t in c)

    def scores(self, query: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for term in self.terms_of(query):
            df = self.df.get(term, 0)
            if not df:
                continue
            idf = math.log((self.n - df + 0.5) / (df + 0.5) + 1.0)
            for k, c in self.docs.items():
                tf = c.get(term, 0)
                if tf:
                    norm = 1.2 * (0.25 + 0.75 * self.lengths[k] / self.avg)
                    out[k] = out.get(k, 0.0) + idf * 2.2 * tf / (tf + norm)
        return out


def overlap(keys: list[int], truth: dict[int, float], k: int = 10) -> float:
    ranked = sorted(truth.values(), reverse=True)
    if not ranked:
        return 1.0
    cut = ranked[min(k, len(ranked)) - 1]
    return sum(1 for key in keys[:k] if truth.get(key, -1.0) >= cut * (1 - 1e-6)) / min(k, len(ranked))


def print_ratios(mean_overlap: dict[str, float], p50: dict[str, float]) -> None:
    """The issue's FTS figures from this run: top-10 overlaps (LanceDB's and base-only beside ours) and p50 ratios."""
    ours, lancedb, base = "ours (global BM25, LSM)", "LanceDB LSM FTS", "Lance FTS, base only"
    lines = [
        ("top-10 overlap with global BM25, ours", f"{mean_overlap[ours]:.3f}  (target >= 0.95)"),
        ("  LanceDB LSM FTS (per-source BM25)", f"{mean_overlap[lancedb]:.3f}"),
        ("  Lance FTS, base only", f"{mean_overlap[base]:.3f}"),
        ("overlap ours - LanceDB LSM FTS", f"{mean_overlap[ours] - mean_overlap[lancedb]:+.3f}"),
        ("p50 ours / Lance FTS base only", f"{p50[ours] / p50[base]:.2f}"),
        ("p50 ours / LanceDB LSM FTS", f"{p50[ours] / p50[lancedb]:.2f}"),
        ("  p50 LanceDB LSM FTS / Lance FTS base only", f"{p50[lancedb] / p50[base]:.2f}"),
    ]
    print("ratios (this run):")
    for label, value in lines:
        print(f"  {label:46s} {value}")


def first_and_p50(reader, queries: list[str], first_query: str, repeat: int) -> tuple[float, float]:
    """A new reader's first query (seconds), then the p50 of `repeat` rounds over the queries."""
    t0 = time.perf_counter()
    reader.full_text_search(first_query, k=10, columns=["id"])
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        for q in queries:
            t0 = time.perf_counter()
            reader.full_text_search(q, k=10, columns=["id"])
            times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def after_flushes(root: str, uri: str, model: dict[int, str], queries: list[str], args) -> None:
    """Issue 44: per flush of one small generation, a new reader's first query against that reader's p50;
    the overlap with global BM25 checked after the last flush."""
    from memwal.reader import LsmReader

    rng = np.random.default_rng(13)
    next_id = max(model) + 1
    ratios, reader = [], None
    for f in range(args.flushes):
        updates = rng.choice(sorted(model), args.flush_rows // 2, replace=False).tolist()
        ids = updates + list(range(next_id, next_id + args.flush_rows - len(updates)))
        next_id += args.flush_rows - len(updates)
        new = texts(rng, len(ids), True)
        flush_apart(root, batch(ids, new))
        model.update(zip(ids, new, strict=True))
        reader = LsmReader(uri)
        first, p50 = first_and_p50(reader, queries, queries[f % len(queries)], args.repeat)
        ratios.append(first / p50)
        print(f"flush {f + 1} (+{args.flush_rows} rows, {len(reader.sources)} sources, live rows {len(model)}): "
              f"first query {first * 1000:.1f} ms, p50 {p50 * 1000:.1f} ms, first / p50 {first / p50:.2f}")
    if reader is not None:
        truth = Truth(model)
        mean_overlap = statistics.mean(
            overlap(reader.full_text_search(q, k=10, columns=["id"]).column("id").to_pylist(), truth.scores(q))
            for q in queries)
        print(f"  {'first query after a flush / p50 (median)':46s} {statistics.median(ratios):.2f}  (target <= 3)")
        print(f"  {'top-10 overlap with global BM25 after them':46s} {mean_overlap:.3f}")


def after_merge(uri: str, model: dict[int, str], queries: list[str], args) -> None:
    """Issue 44: the unmerged generations merged into a new base version (the view unchanged); a new reader's
    first query against its p50, and the overlap with global BM25."""
    from memwal.merge import merge_table
    from memwal.reader import LsmReader

    merge_table(uri)
    reader = LsmReader(uri)
    first, p50 = first_and_p50(reader, queries, queries[0], args.repeat)
    truth = Truth(model)
    mean_overlap = statistics.mean(
        overlap(reader.full_text_search(q, k=10, columns=["id"]).column("id").to_pylist(), truth.scores(q))
        for q in queries)
    print(f"after a merge ({len(reader.sources)} sources, live rows {len(model)}): first query {first * 1000:.1f} ms, "
          f"p50 {p50 * 1000:.1f} ms")
    print(f"  {'first query after a merge / p50':46s} {first / p50:.2f}")
    print(f"  {'top-10 overlap with global BM25 after it':46s} {mean_overlap:.3f}")


def main() -> None:
    if sys.argv[1:2] == ["--flush-into"]:  # the writer process of flush_apart
        import pyarrow.feather as feather

        flush(sys.argv[2], feather.read_table(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-rows", type=int, default=200_000)
    ap.add_argument("--generations", type=int, default=12)
    ap.add_argument("--merged", type=int, default=4, help="generations merged without index catch-up")
    ap.add_argument("--gen-rows", type=int, default=4000)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flushes", type=int, default=5, help="generations flushed after the warm measurement")
    ap.add_argument("--flush-rows", type=int, default=1000)
    ap.add_argument("--root", default=None)
    args = ap.parse_args()

    import lance
    from lancedb_client import LanceDbClient

    from memwal.reader import LsmReader

    root = args.root or tempfile.mkdtemp(prefix="memwal-bench-fts-")
    try:
        t0 = time.perf_counter()
        uri, model = build(root, args)
        log(f"table built in {time.perf_counter() - t0:.1f} s")
        truth = Truth(model)
        rng = np.random.default_rng(11)
        # Two or three words, one from each end of the Zipf ranking: common in one source, rare in the other.
        queries = [" ".join([VOCAB[i] for i in rng.integers(0, 12, 1)] + [VOCAB[-1 - i] for i in rng.integers(0, 12, 1)]
                            + [VOCAB[i] for i in rng.integers(12, len(VOCAB), int(rng.integers(0, 2)))])
                   for _ in range(args.queries)]

        reader = LsmReader(uri)
        t0 = time.perf_counter()
        reader.full_text_search(queries[0], k=10, columns=["id"])
        first = time.perf_counter() - t0
        plan = reader.last_fts_plan

        base = lance.dataset(uri)

        lancedb_t = LanceDbClient(root, "t")  # opened once: a query pays no connect or open

        contestants = {
            "ours (global BM25, LSM)": lambda q: reader.full_text_search(q, k=10, columns=["id"])
            .column("id").to_pylist(),
            "LanceDB LSM FTS": lambda q: lancedb_t.text_ids(q, 10),
            "Lance FTS, base only": lambda q: base.to_table(full_text_query={"query": q, "columns": ["text"]},
                                                            columns=["id"], limit=10).column("id").to_pylist(),
        }
        print(f"base {args.base_rows} rows, {args.generations} generations of {args.gen_rows} "
              f"({args.merged} merged, index not caught up); {len(queries)} queries, live rows {len(model)}")
        print(f"ours, first query (counts the view's terms once per snapshot): {first * 1000:.0f} ms; plan "
              f"{ {k: v for k, v in plan.to_dict().items() if k not in ('terms', 'doc_frequency')} }")
        true_scores = {q: truth.scores(q) for q in queries}
        p50, mean_overlap = {}, {}
        for name, fn in contestants.items():
            overlaps, times = [], []
            for q in queries:
                keys = fn(q)
                overlaps.append(overlap(keys, true_scores[q]))
            for _ in range(args.repeat):
                for q in queries:
                    t0 = time.perf_counter()
                    fn(q)
                    times.append(time.perf_counter() - t0)
            p50[name] = statistics.median(times)
            mean_overlap[name] = statistics.mean(overlaps)
            print(f"{name:28s} top-10 overlap with global BM25 {statistics.mean(overlaps):.3f} "
                  f"(min {min(overlaps):.2f})  p50 {p50[name] * 1000:.1f} ms")
        lancedb_t.close()
        print_ratios(mean_overlap, p50)
        after_flushes(root, uri, model, queries, args)
        after_merge(uri, model, queries, args)
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
