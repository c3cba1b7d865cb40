#!/usr/bin/env python
"""Write the compose deployment's demo table (`memwal-demo-table` in the image; run by airflow-init).

The table of the tables file (default `demo`) is written at its URI with the storage options of its Airflow
connection (`AIRFLOW_CONN_MEMWAL_MINIO` in docker-compose.yaml): a base table with a 4-bucket MemWAL and a
scalar index, then batches of upserts and deletes through the region writer, flushed as generations
(`memwal.demo.write`, the table of `make demo`), so the MemWAL page has regions with unmerged generations
to show. `--if-missing` leaves an existing table alone.
"""

from __future__ import annotations

import argparse
import sys

from memwal.airflow.config import get_table
from memwal.airflow.hooks.memwal import MemWalHook
from memwal.demo import write
from memwal.mem_wal_index import load_index


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
    write(cfg.uri, args.base_rows, args.batches, args.batch_rows, seed=7, storage_options=options)
    print(f"memwal-demo-table: wrote {cfg.uri} ({args.base_rows} base rows, {args.batches} batches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
