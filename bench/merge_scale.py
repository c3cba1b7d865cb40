"""Merge-scale benchmark: one commit of a fixed backlog into base tables of growing size (issue 17).

The backlog: 20,000 upserts (10,000 updates of random base keys, 10,000 inserts) and 2,000 deletes of
other random base keys, in two flushed generations of one region (the deletes in the second). The base:
`int64` key with a BTREE index, 1M-row fragments, the schema and rows of bench/merge.py. A second region
carries the same upserts without the deletes ("upserts only").

Each base size is written once; every contestant starts from a restore of that version (a new version
with the same manifest: merged_generations back to none, generations untouched). Contestants:
- ours in process: `merge_table(regions=[region])`, the in-process dedup;
- ours on Spark: the same with `spark_dedup` (`local[2]`; the session and the executors' Python workers
  are started before, not timed);
- baseline: Lance's one `merge_insert` with `when_not_matched_by_source_delete(<keys>)` and the marker,
  today's single commit (the dedup is done ahead and not timed).
Each contestant runs --repeat times (the median is reported). Every contestant's table must equal the
others' (row count, sums over every row, and every backlog key's row). Then where the upsert-only cost
comes from: the index path against `use_index(False)` (a key scan), updates spread over every fragment
against updates within one, and (at the second size) the same base in more, smaller fragments.
Prints every time, its breakdown and the targets' ratios; never fails on numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "plugins"))
sys.path.insert(0, REPO)

from merge import SCHEMA, _rows, log  # noqa: E402  (bench/merge.py: the same table, rows and log)

from memwal import merge as memwal_merge  # noqa: E402
from memwal.memory import limit_malloc_arenas  # noqa: E402
from memwal.sql import keys_predicate  # noqa: E402
from memwal.table import MemWalTable  # noqa: E402
from memwal.writer import RegionWriter, WriterConfig  # noqa: E402

FRAGMENT_ROWS = 1 << 20
UPDATES, INSERTS, DELETES = 10_000, 10_000, 2_000
TARGET_ROWS = 32_000_000  # the targets are stated at this size (against the smallest)
FRESH = 200_000  # the streaming-append backlog: fresh keys only
KINDS = {"mixed": "with deletes", "upserts": "upserts only",
         "after_merge": "with deletes, after an earlier merge of the upserts (deletion files in every fragment)",
         "fresh": f"{FRESH:,} fresh-key inserts"}
# in-process contestants: (MergeConfig.apply); "apply" is the fragment apply (memwal.merge_apply) in process
APPLY = {"local": "passes", "spark": "passes", "apply": "fragments"}


def _base_batches(n: int, batch: int = FRAGMENT_ROWS):
    """The base rows of bench/merge.py (`_rows(ids, 0)`), built with Arrow kernels a batch at a time."""
    for start in range(0, n, batch):
        ids = pa.array(np.arange(start, min(n, start + batch), dtype=np.int64))
        yield pa.record_batch([
            ids, pc.binary_join_element_wise("n0-", pc.cast(ids, pa.string()), ""),
            pc.multiply(pc.cast(ids, pa.float64()), 0.5),
            pa.array(np.full(len(ids), 1_700_000_000_000_000, "datetime64[us]")),
        ], schema=SCHEMA)


def build(path: str, base_rows: int, fragment_rows: int = FRAGMENT_ROWS, seed: int = 17) -> dict:
    """The base (indexed, MemWAL initialised) and two regions: `mixed` (upserts, then deletes) and `upserts`
    (the same upserts). Returns the base version, the region ids and the backlog's keys."""
    rng = np.random.default_rng(seed)
    reader = pa.RecordBatchReader.from_batches(SCHEMA, _base_batches(base_rows))
    lance.write_dataset(reader, path, max_rows_per_file=fragment_rows)
    ds = lance.dataset(path)
    ds.create_scalar_index("id", "BTREE")
    lance.dataset(path).initialize_mem_wal(unsharded=True)
    picked = rng.choice(base_rows, size=UPDATES + DELETES, replace=False)
    updates, deletes = np.sort(picked[:UPDATES]), np.sort(picked[UPDATES:])
    inserts = np.arange(base_rows, base_rows + INSERTS)
    upserts = _rows(np.concatenate([updates, inserts]), 1)
    config = WriterConfig(max_memtable_rows=10**9, max_memtable_bytes=1 << 40, max_flush_interval_s=None)
    regions = {"mixed": str(uuid.uuid4()), "upserts": str(uuid.uuid4()), "fresh": str(uuid.uuid4())}
    fresh = _rows(np.arange(base_rows + (1 << 20), base_rows + (1 << 20) + FRESH), 3)
    for kind, region in regions.items():
        with RegionWriter(path, region, config=config) as w:
            w.put(fresh if kind == "fresh" else upserts)
            w.flush()
            if kind == "mixed":
                w.delete(pa.table({"id": pa.array(deletes)}))
                w.flush()
    return {"version": lance.dataset(path).version, "regions": regions, "upserts": upserts,
            "keys": np.concatenate([updates, inserts, deletes])}


def restore(path: str, version: int) -> None:
    lance.dataset(path, version=version).restore()


def checksum(path: str, keys: np.ndarray) -> tuple:
    """(rows, sum of ids, sum of values, every backlog key's row): what must be equal across contestants."""
    ds = lance.dataset(path)
    total = [0, 0, 0.0]
    for b in ds.to_batches(columns=["id", "value"]):
        total[0] += b.num_rows
        total[1] += pc.sum(b.column(0)).as_py() or 0
        total[2] += pc.sum(b.column(1)).as_py() or 0.0
    touched = ds.to_table(filter=pc.field("id").isin(pa.array(keys))).sort_by("id").to_pylist()
    return total[0], total[1], round(total[2], 3), touched


def ours(path: str, region: str, dedup, apply: str = "passes") -> dict:
    t = time.perf_counter()
    summary = memwal_merge.merge_table(path, regions=[region], config=memwal_merge.MergeConfig(apply=apply),
                                       dedup=dedup)
    wall = time.perf_counter() - t
    if summary.failed_regions:
        raise SystemExit(f"merge failed: {summary.to_dict()}")
    return {"s": wall, "commits": summary.table_commits, "breakdown": dict(summary.timings_s)}


def baseline(path: str, region: str) -> dict:
    """Today's single commit: upserts, a by-source delete of the keys and the marker, one merge_insert."""
    table = MemWalTable.of(path)
    refs = memwal_merge.pending_generations(table, region, 0)
    tables = [memwal_merge.read_generation(r, table.store) for r in refs]
    upserts, deletes, _ = memwal_merge.dedup_generations(tables, ["id"], SCHEMA)
    t = time.perf_counter()
    b = lance.dataset(path).merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    pred = keys_predicate(deletes, ["id"])
    if pred:
        b = b.when_not_matched_by_source_delete(pred)
    b.mark_sstables_as_compacted([CompactedSsTable(region, refs[-1].generation)]).execute(upserts)
    s = time.perf_counter() - t
    return {"s": s, "commits": 1, "breakdown": {"commit": s}}


def upsert_probe(path: str, version: int, upserts: pa.Table, use_index: bool) -> float:
    """One upsert merge_insert (no marker) on a fresh restore of `version`; seconds."""
    restore(path, version)
    b = lance.dataset(path).merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
    t = time.perf_counter()
    b.use_index(use_index).execute(upserts)
    return time.perf_counter() - t


def where_upsert_cost_goes(path: str, version: int, base_rows: int, seed: int = 5) -> dict:
    """The backlog's upserts alone, through the key's index and by a key scan (`use_index(False)`), with
    the updates spread over every fragment (a deletion file rewritten in each) or within the first one."""
    rng = np.random.default_rng(seed)
    inserts = np.arange(base_rows + INSERTS, base_rows + 2 * INSERTS)
    spread = _rows(np.concatenate([np.sort(rng.choice(base_rows, UPDATES, replace=False)), inserts]), 2)
    one = _rows(np.concatenate([np.sort(rng.choice(min(base_rows, FRAGMENT_ROWS), UPDATES, replace=False)),
                                inserts]), 2)
    out = {f"{where}_{path_}": upsert_probe(path, version, rows, path_ == "index")
           for where, rows in (("spread", spread), ("one_fragment", one)) for path_ in ("index", "scan")}
    restore(path, version)
    return out


def lookup_floor(path: str, version: int, keys: pa.Array, upserts: pa.Table) -> dict:
    """Lance's cheapest ways to find (and mark deleted) the rows of the base keys the backlog updates or
    deletes, and nothing else: one filtered read of their row addresses, and one `when_matched_delete`
    merge-insert of the keys (on a fresh restore), each through the key's index and by a key scan. Every
    merge must find those rows and mark them deleted, so it pays at least the cheapest of these."""
    out = {}
    for how, indexed in (("index", True), ("scan", False)):
        restore(path, version)
        t = time.perf_counter()
        found = lance.dataset(path).to_table(columns=[], filter=pc.field("id").isin(keys), with_row_address=True,
                                             use_scalar_index=indexed)
        out[f"read_{how}"] = time.perf_counter() - t
        assert found.num_rows == len(keys), (how, found.num_rows)
        b = lance.dataset(path).merge_insert("id").when_matched_delete().use_index(indexed)
        t = time.perf_counter()
        b.execute(pa.table({"id": keys}))
        out[f"delete_{how}"] = time.perf_counter() - t
        if indexed:  # Lance's floor for the whole merge: that delete, plus one append of the new rows
            t = time.perf_counter()
            lance.write_dataset(upserts, path, mode="append", max_rows_per_file=FRAGMENT_ROWS)
            out["append"] = time.perf_counter() - t
    restore(path, version)
    out["floor"] = out["delete_index"] + out["append"]
    return out


def floor_once(path: str, version: int, keys: pa.Array, upserts: pa.Table) -> float:
    """Lance's floor once, on a restore of `version`: the `when_matched_delete` of the touched keys through
    the key's index, then the append of the upserts (as `lookup_floor`); seconds."""
    restore(path, version)
    b = lance.dataset(path).merge_insert("id").when_matched_delete().use_index(True)
    t = time.perf_counter()
    b.execute(pa.table({"id": keys}))
    lance.write_dataset(upserts, path, mode="append", max_rows_per_file=FRAGMENT_ROWS)
    return time.perf_counter() - t


def ab_orders(path: str, info: dict, keys: pa.Array, rounds: int) -> dict:
    """The mixed backlog merged deletes first (forced) and upserts first (what `merge_commit.plan_passes`
    picks for it), with Lance's floor, `rounds` times interleaved (the two orders alternating which goes
    first): medians of the wall times and of each pass."""
    from memwal import merge_commit

    real = merge_commit.plan_passes
    forced = {"deletes_first": lambda m, s, w, u, d: real(m, s, {}, u, d), "upserts_first": real}
    out: dict = {}
    try:
        for i in range(rounds):
            for name in (("upserts_first", "deletes_first") if i % 2 else ("deletes_first", "upserts_first")):
                merge_commit.plan_passes = forced[name]
                restore(path, info["version"])
                r = ours(path, info["regions"]["mixed"], memwal_merge.local_dedup)
                out.setdefault(name, []).append((r["s"], r["breakdown"]))
            out.setdefault("floor", []).append((floor_once(path, info["version"], keys, info["upserts"]), {}))
    finally:
        merge_commit.plan_passes = real
        restore(path, info["version"])

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    return {name: {"s": med([t for t, _ in runs]), "all_s": [t for t, _ in runs],
                   **{k: med([b.get(k, 0.0) for _, b in runs]) for k in ("delete_pass", "upsert_pass")}}
            for name, runs in out.items()}


@contextlib.contextmanager
def _fixed_costs_reverted():
    """The merge as before issue 44's fixed-cost cuts (5a75a64): the delete pass's index rule of the upsert
    pass, the hash dedup for every key, and a malloc_trim after the run's last commit (`ab_fixed`)."""
    from memwal import dedup, merge_commit
    from memwal.memory import release_unused

    real = merge_commit.use_index_to_delete, dedup._last_per_key, memwal_merge.merge_table

    def hash_last(rows, pk):
        keys = rows.select(list(pk)).append_column("__pos", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        last = keys.group_by(list(pk), use_threads=True).aggregate([("__pos", "max")]).column("__pos_max")
        return rows.take(pa.array(np.sort(last.to_numpy())))

    def trimmed(*args, **kwargs):
        try:
            return real[2](*args, **kwargs)
        finally:
            release_unused()

    def upsert_rule(ds, keys, pk=(), **kwargs):
        return merge_commit.use_index(ds, keys, pk)

    merge_commit.use_index_to_delete, dedup._last_per_key, memwal_merge.merge_table = (
        upsert_rule, hash_last, trimmed)
    try:
        yield
    finally:
        merge_commit.use_index_to_delete, dedup._last_per_key, memwal_merge.merge_table = real


@contextlib.contextmanager
def _no_read_ahead():
    """The merge without the delete pass's index read-ahead (`memwal.index_read_ahead`): `ab_read_ahead`."""
    from memwal import merge_commit

    real = merge_commit._read_ahead_reader
    merge_commit._read_ahead_reader = lambda *args: None
    try:
        yield
    finally:
        merge_commit._read_ahead_reader = real


def ab_fixed(path: str, info: dict, keys: pa.Array, rounds: int, reverted=None) -> dict:
    """The mixed backlog merged with the fixed-cost cuts reverted ("before") and as is ("after"), `rounds`
    times each, alternating which goes first, each right after Lance's floor on the same restore: the median
    of the per-pair ratios to the floor, and of after / before within a round. `reverted`: the context that
    makes "before" (default the cuts of 5a75a64 reverted; `_no_read_ahead` for --ab-read-ahead)."""
    out: dict = {"before": [], "after": []}
    for i in range(rounds):
        for name in (("after", "before") if i % 2 else ("before", "after")):
            floor = floor_once(path, info["version"], keys, info["upserts"])
            restore(path, info["version"])
            ctx = (reverted or _fixed_costs_reverted)() if name == "before" else contextlib.nullcontext()
            with ctx:
                r = ours(path, info["regions"]["mixed"], memwal_merge.local_dedup)
            out[name].append((r["s"], floor, r["breakdown"]))
    restore(path, info["version"])

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    return {**{name: {"s": med([t for t, _, _ in runs]), "ratio": med([t / f for t, f, _ in runs]),
                      "pairs": [(t, f) for t, f, _ in runs],
                      "breakdown": {k: med([b.get(k, 0.0) for _, _, b in runs])
                                    for k in ("plan", "dedup", "commit", "upsert_pass", "delete_pass")}}
               for name, runs in out.items()},
            "after_over_before": med([a[0] / b[0] for a, b in zip(out["after"], out["before"], strict=True)])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="1000000,8000000,32000000",
                   help="base rows, comma separated (add 64000000 where the machine has room)")
    p.add_argument("--engines", default="local,apply,spark,baseline",
                   help="local: two passes in process; apply: the fragment apply in process; spark: two passes, "
                        "dedup on Spark; baseline: Lance's one merge-insert")
    p.add_argument("--distributed", default="",
                   help="masters for the distributed apply, e.g. local[1],local[2],standalone (two 1-core workers)")
    p.add_argument("--distributed-upserts", type=int, default=1_000_000,
                   help="random updates of the distributed apply's backlog (at the largest size)")
    p.add_argument("--repeat", type=int, default=3, help="runs per contestant (the median is reported)")
    p.add_argument("--small-fragments", type=int, default=1 << 17,
                   help="fragment rows of the extra base (second size) that measures the fragment count")
    p.add_argument("--kinds", default=",".join(KINDS), help="backlogs to run, of: " + ", ".join(KINDS))
    p.add_argument("--floor-only", action="store_true",
                   help="of the extra figures, only Lance's floor (no upsert-cost probes, no small-fragment base)")
    p.add_argument("--paired-floor", action="store_true",
                   help="before each run of ours (with deletes), measure Lance's floor on the same restore: "
                        "the ratio per pair, on a loaded machine the fairer figure")
    p.add_argument("--ab-orders", type=int, default=0,
                   help="also merge the mixed backlog deletes first and upserts first this many times each, "
                        "interleaved with Lance's floor (the passes' two orders, memwal.merge_commit.plan_passes)")
    p.add_argument("--ab-fixed", type=int, default=0,
                   help="also merge the mixed backlog this many times with issue 44's fixed-cost cuts reverted and "
                        "as many times as is, alternating, each paired with Lance's floor (`ab_fixed`)")
    p.add_argument("--ab-read-ahead", type=int, default=0,
                   help="also merge the mixed backlog this many times without the delete pass's index read-ahead "
                        "and as many times with it, alternating, each paired with Lance's floor")
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    sizes = [int(x) for x in args.sizes.split(",") if x]
    engines = [e for e in args.engines.split(",") if e]
    limit_malloc_arenas()  # as `memwal merge` does (memwal.jobs.run_job)
    dedups = {"local": memwal_merge.local_dedup}
    spark = None
    if "spark" in engines:
        from spark_jobs.common import build_spark
        from spark_jobs.merge_dedup import spark_dedup, warm_up

        spark, _ = build_spark("bench-merge-scale", master="local[2]")
        warm_up(spark)
        dedups["spark"] = spark_dedup(spark)
    work = tempfile.mkdtemp(prefix="bench-merge-scale-", dir=args.dir)
    results: dict = {"settings": vars(args), "lance": lance.__version__, "sizes": {}}
    try:
        for n in sizes:
            path = os.path.join(work, f"base-{n}")
            t = time.perf_counter()
            info = build(path, n)
            log(f"{n} rows: base + backlog built in {time.perf_counter() - t:.0f} s "
                f"({len(lance.dataset(path).get_fragments())} fragments)")
            res: dict = {}
            sums: dict = {}
            touched = pa.array(np.concatenate([info["keys"][:UPDATES], info["keys"][UPDATES + INSERTS:]]))
            for kind in kinds:
                region = info["regions"]["mixed" if kind == "after_merge" else kind]
                for engine in engines:
                    runs = []
                    for _ in range(args.repeat):
                        restore(path, info["version"])
                        if kind == "after_merge":  # not timed: leaves deletion files in every fragment
                            memwal_merge.merge_table(path, regions=[info["regions"]["upserts"]])
                        log(f"{n} rows, {kind}: {engine}")
                        paired = None
                        if args.paired_floor and kind == "mixed" and engine != "baseline":
                            paired = floor_once(path, info["version"], touched, info["upserts"])
                            restore(path, info["version"])
                        runs.append(baseline(path, region) if engine == "baseline"
                                    else ours(path, region, dedups.get(engine, memwal_merge.local_dedup),
                                              APPLY[engine]))
                        if paired is not None:
                            runs[-1]["floor_s"] = paired
                    pairs = [(r["s"], r["floor_s"]) for r in runs if "floor_s" in r]
                    runs.sort(key=lambda r: r["s"])
                    res.setdefault(kind, {})[engine] = {**runs[len(runs) // 2], "all_s": [r["s"] for r in runs],
                                                        "pairs": pairs}
                    sums.setdefault(kind, {})[engine] = checksum(path, info["keys"])
                first = next(iter(sums[kind].values()))
                res[kind]["equal"] = all(s == first for s in sums[kind].values())
            if args.ab_orders:
                log(f"{n} rows: the passes' two orders, {args.ab_orders} rounds")
                res["orders"] = ab_orders(path, info, touched, args.ab_orders)
            if args.ab_fixed:
                log(f"{n} rows: the fixed-cost cuts reverted and as is, {args.ab_fixed} rounds")
                res["ab_fixed"] = ab_fixed(path, info, touched, args.ab_fixed)
            if args.ab_read_ahead:
                log(f"{n} rows: without and with the index read-ahead, {args.ab_read_ahead} rounds")
                res["ab_read_ahead"] = ab_fixed(path, info, touched, args.ab_read_ahead, _no_read_ahead)
            if not args.floor_only:
                log(f"{n} rows: where the upsert cost goes")
                res["upsert_cost"] = where_upsert_cost_goes(path, info["version"], n)
            res["floor"] = lookup_floor(path, info["version"], touched, info["upserts"])
            res["fragments"] = len(lance.dataset(path).get_fragments())
            if n == sizes[min(1, len(sizes) - 1)] and args.small_fragments and not args.floor_only:
                small = os.path.join(work, f"small-{n}")
                sinfo = build(small, n, fragment_rows=args.small_fragments)
                log(f"{n} rows in {args.small_fragments}-row fragments: upserts")
                res["small_fragments"] = {
                    "fragment_rows": args.small_fragments, "fragments": len(lance.dataset(small).get_fragments()),
                    **where_upsert_cost_goes(small, sinfo["version"], n)}
                shutil.rmtree(small)
            results["sizes"][n] = res
            if args.distributed and n == sizes[-1]:
                from merge_apply_dist import distributed  # bench/merge_apply_dist.py

                results["distributed"] = distributed(path, info["version"], n, args.distributed.split(","),
                                                     args.distributed_upserts)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if spark is not None:
            spark.stop()
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report(results, sizes, engines, kinds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2, default=str)


def _fmt(r: dict) -> str:
    parts = ", ".join(f"{k} {v:.3f}" for k, v in r["breakdown"].items())
    runs = ", ".join(f"{x:.3f}" for x in r["all_s"])
    return f"{r['s']:7.3f} s  ({r['commits']} Lance commit(s): {parts}; runs {runs})"


def _cost(u: dict) -> str:
    return (f"updates over every fragment: index {u['spread_index']:.3f} s, key scan {u['spread_scan']:.3f} s; "
            f"within one fragment: index {u['one_fragment_index']:.3f} s, key scan {u['one_fragment_scan']:.3f} s")


def report(results: dict, sizes: list[int], engines: list[str], kinds: list[str]) -> None:
    print(f"\nmerge of {UPDATES + INSERTS:,} upserts ({UPDATES:,} updates) + {DELETES:,} deletes, one commit, "
          f"lance {results['lance']}")
    for n in sizes:
        res = results["sizes"][n]
        for kind in kinds:
            label = KINDS[kind]
            print(f"{n:>11,} rows, {label} (tables equal: {res[kind]['equal']}):")
            for engine in engines:
                print(f"    {engine:9s}{_fmt(res[kind][engine])}")
            if "baseline" in res[kind] and "local" in res[kind]:
                ratio = res[kind]["baseline"]["s"] / res[kind]["local"]["s"]
                print(f"    ratio baseline/ours (in process): {ratio:.2f}")
        if "upsert_cost" in res:
            print(f"    upserts alone, {res['fragments']} fragments: {_cost(res['upsert_cost'])}")
        f = res["floor"]
        print(f"    finding the rows of the {UPDATES + DELETES:,} base keys the backlog updates or deletes: a filtered "
              f"read, index {f['read_index']:.3f} s, key scan {f['read_scan']:.3f} s; a when_matched_delete of "
              f"them, index {f['delete_index']:.3f} s, key scan {f['delete_scan']:.3f} s")
        if "small_fragments" in res:
            s = res["small_fragments"]
            print(f"    upserts alone, {s['fragments']} fragments of {s['fragment_rows']:,} rows: {_cost(s)}")
    lo, hi = sizes[0], (TARGET_ROWS if TARGET_ROWS in sizes else sizes[-1])
    print("\ntargets (with deletes):")
    for engine in [e for e in engines if e != "baseline"]:
        a, b = results["sizes"][lo]["mixed"][engine]["s"], results["sizes"][hi]["mixed"][engine]["s"]
        print(f"  ours ({engine}) at {hi:,} / at {lo:,}: {b / a:.2f}   (target <= 2)")
    floor = min(v for k, v in results["sizes"][hi]["floor"].items() if k.startswith(("read_", "delete_")))
    if "local" in engines:
        a = results["sizes"][lo]["mixed"]["local"]["s"]
        print(f"  floor: finding and deleting the rows the backlog replaces or deletes at {hi:,} ({floor:.3f} s, "
              f"Lance's cheapest way, nothing else written) / ours at {lo:,}: {floor / a:.2f}   (above 2: no merge "
              f"through Lance 14 meets <= 2 on this backlog)")
    if "baseline" in engines:
        base_lo = results["sizes"][lo]["mixed"]["baseline"]["s"]
        base_hi = results["sizes"][hi]["mixed"]["baseline"]["s"]
        print(f"  baseline at {hi:,} / at {lo:,}: {base_hi / base_lo:.2f}   (for reference)")
        for engine in [e for e in engines if e != "baseline"]:
            ours_hi = results["sizes"][hi]["mixed"][engine]["s"]
            print(f"  baseline / ours ({engine}) at {hi:,}: {base_hi / ours_hi:.2f}   (target >= 3)")
        after = results["sizes"][hi].get("after_merge", {})
        for engine in [e for e in engines if e != "baseline" and e in after]:
            print(f"  baseline / ours ({engine}) at {hi:,}, after an earlier merge: "
                  f"{after['baseline']['s'] / after[engine]['s']:.2f}   (for reference)")
    print("\nthe fragment apply (issue 26), in process:")
    for n in sizes:
        res = results["sizes"][n]
        floor = res["floor"]["floor"]
        for engine in [e for e in ("local", "apply") if e in engines]:
            print(f"  {n:>11,} rows: ours ({engine}) / Lance's floor (a delete of the touched keys through the "
                  f"index + an append of the new rows, {floor:.3f} s): {res['mixed'][engine]['s'] / floor:.2f}   "
                  f"(target <= 1.3 at 8M and 32M)")
            pairs = [(r, f) for r, f in res["mixed"][engine].get("pairs", [])]
            if pairs:
                ratios = sorted(r / f for r, f in pairs)
                print(f"  {n:>11,} rows: ours ({engine}) / the floor measured right before it, per pair: median "
                      f"{ratios[len(ratios) // 2]:.2f} (pairs {', '.join(f'{r:.3f}/{f:.3f}' for r, f in pairs)})")
    for engine in [e for e in engines if e != "baseline" and "fresh" in kinds]:
        a, b = results["sizes"][lo]["fresh"][engine]["s"], results["sizes"][sizes[-1]]["fresh"][engine]["s"]
        print(f"  fresh-key inserts, ours ({engine}) at {sizes[-1]:,} / at {lo:,}: {b / a:.2f}   (target <= 1.5)")
    if "distributed" in results:
        from merge_apply_dist import report as report_distributed

        report_distributed(results["distributed"])
    for n in sizes:
        orders = results["sizes"][n].get("orders")
        if orders:
            floor = orders["floor"]["s"]
            for name in ("deletes_first", "upserts_first"):
                o = orders[name]
                print(f"  {n:>11,} rows, {name.replace('_', ' ')}: median {o['s']:.3f} s (delete pass "
                      f"{o['delete_pass']:.3f}, upsert pass {o['upsert_pass']:.3f}); / Lance's floor "
                      f"({floor:.3f} s, median, same rounds): {o['s'] / floor:.2f}   (target <= 1.0)")
    for n in sizes:
        for key, what, before in (("ab_fixed", "fixed-cost cuts", "reverted"),
                                  ("ab_read_ahead", "index read-ahead", "off")):
            ab = results["sizes"][n].get(key)
            if not ab:
                continue
            for name in ("before", "after"):
                print(f"  {n:>11,} rows, {what} {before if name == 'before' else 'as is'}: median "
                      f"{ab[name]['s']:.3f} s ({', '.join(f'{k} {v:.3f}' for k, v in ab[name]['breakdown'].items())})"
                      f"; / the floor right before it, per pair: median {ab[name]['ratio']:.2f}")
            print(f"  {n:>11,} rows, as is / {before}, same round: median {ab['after_over_before']:.2f}")
    print(f"peak RSS of this process: {results['peak_rss_mb']:.0f} MiB")
    equal = all(results["sizes"][n][k]["equal"] for n in sizes for k in kinds)
    print(f"every contestant's table equal to the others': {equal}")


if __name__ == "__main__":
    main()
