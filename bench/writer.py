"""Write throughput: our RegionWriter against Lance core's ShardWriter, on the same batches.

Both writers get the same pre-generated batches and do the same work, on the local filesystem:
- one durable WAL entry (an Arrow IPC file) per put, written before put returns;
- a MemTable flush to a new generation (a Lance table with a primary-key index) every --flush-rows rows;
- the final flush on close.

The clock covers opening the writer (claiming the region), every put, and close. It excludes creating
the base table and `initialize_mem_wal`, which are done once per fresh table before the clock starts.

Lance core's writer, with durable_write=True, makes put wait until a WAL flush has written the put's
rows. By default it flushes the WAL when 10 MB are buffered or when its 100 ms ticker fires, so
single-threaded sequential puts each wait for the ticker. To compare the same work (one WAL entry per
put, written at once), it is given max_wal_buffer_size=1 so that every put triggers its own WAL flush.
`--lance-default-wal` adds a run of Lance core with its default WAL knobs, for information.

Run from the repository root: `.venv/bin/python bench/writer.py` (or `make bench`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from memwal.writer import RegionWriter, WriterConfig

PK = {"lance-schema:unenforced-primary-key": "true"}
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False, metadata=PK),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
        pa.field("tags", pa.list_(pa.int32())),
    ]
)
MEMTABLE_BYTES = 1 << 30  # far above --flush-rows worth of rows: only the row threshold triggers a flush


def log(msg: str) -> None:
    print(msg, flush=True)


# -- data ------------------------------------------------------------------------------------------


def make_rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    name_len = rng.integers(8, 40, n)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
    chars = alphabet[rng.integers(0, len(alphabet), int(name_len.sum()))]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(name_len, out=offsets[1:])
    names = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))
    tag_len = rng.integers(0, 4, n)
    tag_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(tag_len, out=tag_offsets[1:])
    tag_values = pa.array(rng.integers(0, 1000, int(tag_len.sum()), np.int32))
    tags = pa.ListArray.from_arrays(pa.array(tag_offsets), tag_values)
    updated = 1_790_000_000_000_000 + rng.integers(0, 86_400_000_000, n)
    return pa.Table.from_arrays(
        [pa.array(ids), names, pa.array(rng.random(n) * 100), pa.array(updated, SCHEMA.field("updated_at").type), tags],
        schema=SCHEMA,
    )


def make_batches(total_rows: int, batch_rows: int, update_fraction: float, first_id: int, seed: int) -> list[pa.Table]:
    """Batches of batch_rows rows: mostly new keys, update_fraction of them re-writing earlier keys."""
    rng = np.random.default_rng(seed)
    batches = []
    next_id = first_id
    for start in range(0, total_rows, batch_rows):
        n = min(batch_rows, total_rows - start)
        n_upd = int(n * update_fraction) if next_id > 0 else 0
        upd = rng.choice(next_id, n_upd, replace=False) if n_upd else np.empty(0, np.int64)
        fresh = np.arange(next_id, next_id + n - n_upd, dtype=np.int64)
        next_id += len(fresh)
        ids = np.concatenate([fresh, upd.astype(np.int64)])
        rng.shuffle(ids)
        batches.append(make_rows(ids, rng))
    return batches


def create_base(uri: str, base: pa.Table) -> None:
    """A fresh base table with the primary key, MemWAL initialised (one unsharded region)."""
    ds = lance.write_dataset(base, uri)
    ds.initialize_mem_wal(unsharded=True)


# -- writers ---------------------------------------------------------------------------------------


@dataclass
class Run:
    seconds: float
    detail: dict = field(default_factory=dict)


def run_ours(uri: str, batches: list[pa.Table], flush_rows: int) -> Run:
    config = WriterConfig(max_memtable_rows=flush_rows, max_memtable_bytes=MEMTABLE_BYTES, max_flush_interval_s=None)
    started = time.perf_counter()
    writer = RegionWriter(uri, str(uuid.uuid4()), config=config)
    for batch in batches:
        writer.put(batch)
    writer.close()
    seconds = time.perf_counter() - started
    s = writer.stats
    return Run(seconds, {"wal_entries": s.wal_entries, "generations": s.generations_flushed,
                         "flush_seconds": round(s.flush_seconds, 4)})


def run_lance(uri: str, batches: list[pa.Table], flush_rows: int, default_wal: bool = False) -> Run:
    ds = lance.dataset(uri)
    knobs = {} if default_wal else {"max_wal_buffer_size": 1}
    started = time.perf_counter()
    writer = ds.mem_wal_writer(
        str(uuid.uuid4()),
        durable_write=True,
        max_memtable_rows=flush_rows,
        max_memtable_size=MEMTABLE_BYTES,
        max_unflushed_memtable_bytes=4 * MEMTABLE_BYTES,
        max_memtable_batches=1_000_000,
        stats_log_interval_ms=0,
        **knobs,
    )
    for batch in batches:
        writer.put(batch)
    writer.close()
    seconds = time.perf_counter() - started
    s = writer.stats()  # taken after close: does not count the flush done by close
    return Run(seconds, {"wal_flushes": s["wal_flush_count"], "wal_flush_ms": s["wal_flush_time_ms"],
                         "memtable_flush_ms_before_close": s["memtable_flush_time_ms"]})


def layout(uri: str) -> dict:
    """What a run left in _mem_wal/: WAL files and generations (with their row counts)."""
    root = Path(uri) / "_mem_wal"
    wal_files, gens = 0, {}
    for region in root.iterdir():
        if not region.is_dir():
            continue
        wal_dir = region / "wal"
        wal_files += sum(1 for p in wal_dir.iterdir() if p.suffix == ".arrow") if wal_dir.exists() else 0
        for d in region.iterdir():
            if "_gen_" in d.name:
                gen = int(d.name.rsplit("_gen_", 1)[1])
                gens[gen] = lance.dataset(str(d)).count_rows()
                if not (d / "_pk_index").is_dir():
                    raise AssertionError(f"{d} has no _pk_index/")
    return {"wal_files": wal_files, "generation_rows": [gens[g] for g in sorted(gens)]}


# -- driver ----------------------------------------------------------------------------------------


def summarize(runs: list[Run], rows: int) -> dict:
    secs = [r.seconds for r in runs]
    return {
        "seconds": [round(s, 4) for s in secs],
        "median_rows_per_s": round(rows / statistics.median(secs)),
        "best_rows_per_s": round(rows / min(secs)),
        "detail": runs[-1].detail,
    }


def bench_scenario(args, batch_rows: int, workdir: str) -> dict:
    base = make_rows(np.arange(args.base_rows, dtype=np.int64), np.random.default_rng(1))
    batches = make_batches(args.rows, batch_rows, args.update_fraction, args.base_rows, seed=batch_rows)
    rows = sum(b.num_rows for b in batches)
    log(f"\n== {batch_rows}-row batches: {len(batches)} puts, {rows:,} rows, "
        f"{sum(b.nbytes for b in batches) / 1e6:.1f} MB in Arrow, flush every {args.flush_rows:,} rows")
    writers: dict[str, Callable[[str], Run]] = {
        "ours": lambda uri: run_ours(uri, batches, args.flush_rows),
        "lance": lambda uri: run_lance(uri, batches, args.flush_rows),
    }
    if args.lance_default_wal:
        writers["lance_default_wal"] = lambda uri: run_lance(uri, batches, args.flush_rows, default_wal=True)
    runs: dict[str, list[Run]] = {name: [] for name in writers}
    layouts: dict[str, dict] = {}
    for i in range(args.warmup + args.repeat):
        warm = i < args.warmup
        # Alternate the order so that drift (page cache, CPU clock) does not favour one writer.
        order = list(writers) if i % 2 == 0 else list(reversed(writers))
        for name in order:
            if name == "lance_default_wal" and i != args.warmup:
                continue  # informational and slow (puts wait for the WAL ticker): one timed run only
            uri = os.path.join(workdir, f"b{batch_rows}_r{i}_{name}")
            create_base(uri, base)
            gc.collect()
            run = writers[name](uri)
            label = "warm-up" if warm else f"run {i - args.warmup + 1}/{args.repeat}"
            log(f"  {label:>9} {name:<18} {rows / run.seconds:>12,.0f} rows/s  ({run.seconds:.3f} s)")
            if not warm:
                runs[name].append(run)
                layouts.setdefault(name, layout(uri))
    result = {"batch_rows": batch_rows, "puts": len(batches), "rows": rows}
    for name in writers:
        result[name] = summarize(runs[name], rows) | {"layout": layouts[name]}
    result["ratio_ours_over_lance"] = round(
        result["ours"]["median_rows_per_s"] / result["lance"]["median_rows_per_s"], 3
    )
    a, b = layouts["ours"], layouts["lance"]
    same = a == b
    result["same_layout"] = same
    log(f"  layout ours {a}\n  layout lance {b}" + ("" if same else "  <-- DIFFERENT"))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000, help="rows written per run (default 300000)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per writer and scenario; median reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per writer first (default 1)")
    p.add_argument("--batch-rows", default="1000,10000", help="comma-separated rows per put (default 1000,10000)")
    p.add_argument("--flush-rows", type=int, default=100_000, help="MemTable flush threshold in rows")
    p.add_argument("--base-rows", type=int, default=10_000, help="rows in the fresh base table")
    p.add_argument("--update-fraction", type=float, default=0.1, help="share of rows re-writing earlier keys")
    p.add_argument("--lance-default-wal", action="store_true",
                   help="also time Lance core with its default WAL knobs (10 MB buffer, 100 ms ticker), once")
    p.add_argument("--dir", default=None, help="parent of the temporary directory (default: system temp)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")

    results = []
    with tempfile.TemporaryDirectory(prefix="memwal-bench-", dir=args.dir) as workdir:
        log(f"writing under {workdir}")
        for batch_rows in (int(x) for x in args.batch_rows.split(",")):
            results.append(bench_scenario(args, batch_rows, workdir))

    names = [n for n in ("ours", "lance", "lance_default_wal") if n in results[0]]
    print()
    header = f"{'batch rows':>10} {'puts':>6} " + " ".join(f"{n + ' rows/s':>24}" for n in names)
    print(header)
    print("-" * len(header))
    for r in results:
        cells = " ".join(
            f"{r[n]['median_rows_per_s']:>15,} (best {r[n]['best_rows_per_s'] / 1e3:>4.0f}k)" for n in names
        )
        print(f"{r['batch_rows']:>10} {r['puts']:>6} {cells}")
    print(f"(median of {args.repeat} runs; {args.rows:,} rows per run; MemTable flush every {args.flush_rows:,} rows)")
    for r in results:
        print(f"ratio ours/lance ({r['batch_rows']}-row batches): {r['ratio_ours_over_lance']:.2f}")
    if args.out:
        doc = {
            "benchmark": "writer",
            "config": vars(args),
            "environment": {
                "python": platform.python_version(),
                "pylance": lance.__version__,
                "pyarrow": pa.__version__,
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "scenarios": results,
        }
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
