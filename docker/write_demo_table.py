#!/usr/bin/env python
"""Write the compose deployment's demo table (`memwal-demo-table` in the image; run by airflow-init).

The table of the tables file (default `demo`) is written at its URI with the storage options of its Airflow
connection (`AIRFLOW_CONN_MEMWAL_MINIO` in docker-compose.yaml): a base table with a 4-bucket MemWAL and a
scalar index, then batches of upserts and deletes through the region writer, flushed as generations, so
the MemWAL page has regions with unmerged generations to show. `--if-missing` leaves an existing table alone.
"""

from __future__ import annotations

import argparse
import sys

import lance
import numpy as np
import pyarrow as pa

from memwal.airflow.config import get_table
from memwal.airflow.hooks.memwal import MemWalHook
from memwal.mem_wal_index import load_index
from memwal.storage import lance_storage_options
from memwal.table_writer import TableWriter
from memwal.writer import WriterConfig

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"}),
    pa.field("user", pa.string()),
    pa.field("amount", pa.float64()),
])


def rows(ids: np.ndarray, version: int) -> pa.Table:
    return pa.table({"id": ids, "user": [f"user-{i % 97}" for i in ids],
                     "amount": (ids % 1000).astype(np.float64) + version / 10}, schema=SCHEMA)


def exists(uri: str, options: dict[str, str] | None) -> bool:
    try:
        load_index(uri, options)
        return True
    except Exception:  # no table (or no MemWAL) there yet
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="memwal-demo-table", description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default="demo", help="table name in the tables file")
    p.add_argument("--if-missing", action="store_true", help="do nothing when the table exists")
    p.add_argument("--base-rows", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--batch-rows", type=int, default=2_000)
    args = p.parse_args(argv)
    cfg = get_table(args.table, use_variable=False)
    options = MemWalHook.for_table(cfg).storage_options
    if args.if_missing and exists(cfg.uri, options):
        print(f"memwal-demo-table: {cfg.uri} exists")
        return 0
    rng = np.random.default_rng(7)
    ds = lance.write_dataset(rows(np.arange(args.base_rows), 0), cfg.uri, mode="create",
                             storage_options=lance_storage_options(options))
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)
    ds.create_scalar_index("user", "BTREE", name="user_idx")
    config = WriterConfig(max_memtable_rows=args.batch_rows // 2, max_flush_interval_s=None)
    with TableWriter(cfg.uri, storage_options=options, config=config) as writer:
        for b in range(1, args.batches + 1):
            ids = rng.choice(args.base_rows * 2, size=args.batch_rows, replace=False)
            writer.put(rows(ids, b))
            writer.delete(pa.table({"id": rng.choice(ids, size=args.batch_rows // 20, replace=False)}))
    print(f"memwal-demo-table: wrote {cfg.uri} ({args.base_rows} base rows, {args.batches} batches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
