"""Test helper: rows written through Lance core's own region writer (pylance's ShardWriter), as the interop
tests of our searches need them: several generations, with puts and deletes mirrored into a model."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

import lance
import pyarrow as pa


def write_through_lance_core(uri: str, storage_options: dict[str, str] | None, puts: Sequence[dict],
                             deleted: Sequence[int], model: dict, table_of: Callable[[dict], pa.Table],
                             max_memtable_rows: int = 70) -> None:
    """Each dict of `puts` (id -> value) put through one pylance ShardWriter of a new region (flushing every
    `max_memtable_rows` rows), then the `deleted` ids; the model follows."""
    ds = lance.dataset(uri, storage_options=storage_options)
    with ds.mem_wal_writer(str(uuid.uuid4()), max_memtable_rows=max_memtable_rows) as w:
        for batch in puts:
            w.put(table_of(batch))
            model.update(batch)
        w.delete(pa.table({"id": pa.array(list(deleted), pa.int64())}))
        for i in deleted:
            del model[i]
