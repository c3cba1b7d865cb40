"""Demo data for `make demo`: a bucket-partitioned table written through our writer, and a check.

    python -m memwal.demo write TABLE   base table + MemWAL (4 buckets) + generations with updates/deletes
    python -m memwal.demo verify TABLE  the LSM view equals the model of every write (TABLE.model.json)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import lance
import numpy as np
import pyarrow as pa

from memwal.reader import LsmReader
from memwal.storage import lance_storage_options
from memwal.table_writer import TableWriter
from memwal.writer import WriterConfig

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"}),
    pa.field("user", pa.string()),
    pa.field("amount", pa.float64()),
])


def rows(ids: np.ndarray, version: int) -> pa.Table:
    """The demo's rows for `ids` at write number `version` (amount = id % 1000 + version / 10)."""
    return pa.table({"id": ids, "user": [f"user-{i % 97}" for i in ids],
                     "amount": (ids % 1000).astype(np.float64) + version / 10}, schema=SCHEMA)


def write_batches(table: str, model: dict[int, float], rng: np.random.Generator, batches: int, batch_rows: int,
                  first_version: int, id_space: int, storage_options: dict[str, str] | None = None) -> None:
    """Upsert batches of random ids (and delete a twentieth of each) through the writer; the model follows."""
    config = WriterConfig(max_memtable_rows=batch_rows // 2, max_flush_interval_s=None)
    with TableWriter(table, storage_options=storage_options, config=config) as writer:
        for b in range(batches):
            ids = rng.choice(id_space, size=batch_rows, replace=False)
            t = rows(ids, first_version + b)
            writer.put(t)
            model.update(zip(t.column("id").to_pylist(), t.column("amount").to_pylist(), strict=True))
            dead = rng.choice(ids, size=batch_rows // 20, replace=False)
            writer.delete(pa.table({"id": dead}))
            for i in dead.tolist():
                model.pop(int(i), None)
            print(f"demo: batch {b + 1}/{batches}: {batch_rows} upserts, {len(dead)} deletes", file=sys.stderr)


def write(table: str, base_rows: int, batches: int, batch_rows: int, seed: int,
          storage_options: dict[str, str] | None = None) -> dict[int, float]:
    """The demo table at `table` (base rows, a 4-bucket MemWAL, a BTREE index on `user`, then `batches` of
    upserts and deletes flushed as generations); returns the model of its rows. Also the compose deployment's
    demo table (docker/write_demo_table.py), on S3 through `storage_options`."""
    rng = np.random.default_rng(seed)
    model = {int(i): float(i % 1000) for i in range(base_rows)}
    ds = lance.write_dataset(rows(np.arange(base_rows), 0), table, mode="create",
                             storage_options=lance_storage_options(storage_options))
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4)
    ds.create_scalar_index("user", "BTREE", name="user_idx")
    write_batches(table, model, rng, batches, batch_rows, first_version=1, id_space=base_rows * 2,
                  storage_options=storage_options)
    return model


def verify(table: str, model: dict[int, float]) -> None:
    view = LsmReader(table).scan(columns=["id", "amount"])
    got = dict(zip(view.column("id").to_pylist(), view.column("amount").to_pylist(), strict=True))
    if got != model:
        missing = set(model) - set(got)
        extra = set(got) - set(model)
        raise SystemExit(f"demo: LSM view differs from the model ({len(missing)} missing, {len(extra)} extra)")
    print(f"demo: LSM view matches the model: {len(model)} rows")


def model_path(table: str) -> str:
    """Where `write` keeps the model of a table: beside it, named after it (TABLE.model.json), so that it
    never replaces another file of the table's directory."""
    return os.path.abspath(str(table).rstrip("/")) + ".model.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memwal.demo")
    p.add_argument("action", choices=["write", "verify"])
    p.add_argument("table")
    p.add_argument("--base-rows", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=9)
    p.add_argument("--batch-rows", type=int, default=2_000)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.action == "write":
        model = write(args.table, args.base_rows, args.batches, args.batch_rows, args.seed)
        with open(model_path(args.table), "w") as f:
            json.dump(model, f)
        verify(args.table, model)
    else:
        with open(model_path(args.table)) as f:
            model = {int(k): v for k, v in json.load(f).items()}
        verify(args.table, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
