"""Write throughput with an IVF_PQ and an FTS index maintained: our RegionWriter against Lance core's
ShardWriter on the same batches, both building the indexes on every generation they flush.

Same work and clock as bench/writer.py (one durable WAL entry per put, a flush every --flush-rows rows,
the final flush on close), on a base table with a vector column (IVF_PQ) and a text column (INVERTED),
both in the MemWAL index's maintained_indexes. Runs alternate ours / Lance core, each on a fresh table.
`--flush-rows 10000,100000` measures each flush size in turn (rows written: at least one flush's worth).
`--index-types` also times building each candidate vector index type on one generation of the first size.

Run from the repository root: `.venv/bin/python bench/flush_indexes.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from writer import run_lance, run_ours

PK = {"lance-schema:unenforced-primary-key": "true"}
WORDS = np.array(["apple", "river", "stone", "cloud", "lance", "table", "index", "vector", "search", "merge",
                  "flush", "bloom"])


def make_rows(ids: np.ndarray, dim: int, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * dim, dtype=np.float32)), dim)
    text = [" ".join(WORDS[rng.integers(0, len(WORDS), 6)]) for _ in range(n)]
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK), pa.field("text", pa.string()),
                        pa.field("vec", pa.list_(pa.float32(), dim))])
    return pa.table({"id": pa.array(ids), "text": text, "vec": vec}, schema=schema)


def create_base(uri: str, base: pa.Table) -> None:
    ds = lance.write_dataset(base, uri)
    ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=16, num_sub_vectors=16)
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    lance.dataset(uri).initialize_mem_wal(unsharded=True, maintained_indexes=["vec_idx", "text_idx"])


def index_types(rows: pa.Table) -> dict:
    """Seconds to build each vector index type on one generation-sized table."""
    out = {}
    candidates = {
        "IVF_HNSW_SQ (1 partition, Lance core's)": ("IVF_HNSW_SQ", {"num_partitions": 1}),
        "IVF_FLAT (1 partition, ours)": ("IVF_FLAT", {"num_partitions": 1}),
        "IVF_FLAT (16 partitions)": ("IVF_FLAT", {"num_partitions": 16}),
        "IVF_PQ (16 partitions)": ("IVF_PQ", {"num_partitions": 16, "num_sub_vectors": 16}),
    }
    for label, (kind, params) in candidates.items():
        with tempfile.TemporaryDirectory() as tmp:
            ds = lance.write_dataset(rows, f"{tmp}/g")
            started = time.perf_counter()
            ds.create_index("vec", kind, **params)
            out[label] = round(time.perf_counter() - started, 3)
    return out


def measure(base: pa.Table, batches: list[pa.Table], flush_rows: int, runs: int) -> dict[str, list[float]]:
    """Seconds of each writer over `runs` alternating runs, each on a fresh table; every generation checked to
    hold both maintained indexes and bloom_filter.bin."""
    times: dict[str, list[float]] = {"ours": [], "lance": []}
    for _ in range(runs):
        for name, run in (("ours", run_ours), ("lance", run_lance)):
            with tempfile.TemporaryDirectory() as tmp:
                uri = f"{tmp}/t"
                create_base(uri, base)
                times[name].append(run(uri, batches, flush_rows).seconds)
                gens = sorted(Path(uri, "_mem_wal").glob("*/*_gen_*"))
                for g in gens:
                    names = {d.name for d in lance.dataset(str(g)).describe_indices()}
                    if not {"vec_idx", "text_idx"} <= names or not (g / "bloom_filter.bin").exists():
                        raise AssertionError(f"{name}: {g.name} lacks a maintained index or bloom_filter.bin")
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-rows", type=int, default=20_000)
    p.add_argument("--rows", type=int, default=20_000, help="rows written per run (at least one flush size's worth)")
    p.add_argument("--batch-rows", type=int, default=1_000)
    p.add_argument("--flush-rows", default="10000",
                   help="rows per flush; a comma list measures each size in turn (e.g. 10000,100000)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--index-types", action="store_true")
    a = p.parse_args()
    sizes = [int(x) for x in a.flush_rows.split(",")]
    rng = np.random.default_rng(42)
    base = make_rows(np.arange(a.base_rows, dtype=np.int64), a.dim, rng)
    result: dict = {"args": vars(a), "flush_sizes": {}, "uuid": str(uuid.uuid4())[:8]}
    for size in sizes:
        rows = max(a.rows, size)
        ids = np.arange(a.base_rows // 2, a.base_rows // 2 + rows, dtype=np.int64)  # half updates, half new
        batches = [make_rows(ids[i:i + a.batch_rows], a.dim, rng) for i in range(0, rows, a.batch_rows)]
        times = measure(base, batches, size, a.runs)
        med = {k: statistics.median(v) for k, v in times.items()}
        result["flush_sizes"][size] = {
            "rows": rows,
            "seconds": {k: [round(s, 3) for s in v] for k, v in times.items()},
            "median_rows_per_s": {k: round(rows / s) for k, s in med.items()},
            "ratio_ours_over_lance_throughput": round(med["lance"] / med["ours"], 3),
        }
    if a.index_types:
        result["vector_index_build_s"] = index_types(make_rows(np.arange(sizes[0]), a.dim, rng))
    print(json.dumps(result, indent=2))
    for size, r in result["flush_sizes"].items():  # the ratio, one line per flush size, from this run
        print(f"writer ours / Lance core, flush every {size} rows ({r['rows']} rows, median of {a.runs}): "
              f"{r['ratio_ours_over_lance_throughput']:.2f} (target >= 1.0)", file=sys.stderr)


if __name__ == "__main__":
    main()
