"""Test helper: an LSM reader over a table plus one live MemTable of our region writer, as the search tests'
scenarios end (rows put and deleted in the MemTable, the model following)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pyarrow as pa

from memwal.reader import LsmReader
from memwal.writer import RegionWriter, WriterConfig


@contextmanager
def reader_with_memtable(loc, region: str, rows: dict, deleted: Sequence[int], model: dict,
                         table_of: Callable[[dict], pa.Table]) -> Iterator[LsmReader]:
    """A writer of `region` that never flushes by time puts `rows` and deletes `deleted` in its MemTable; yields
    an LsmReader over the table with that MemTable; the writer closes (flushes) on exit."""
    w = RegionWriter(loc.uri, region, storage_options=loc.storage_options,
                     config=WriterConfig(max_flush_interval_s=None))
    try:
        w.put(table_of(rows))
        w.delete(pa.table({"id": pa.array(list(deleted), pa.int64())}))
        model.update(rows)
        for i in deleted:
            del model[i]
        yield LsmReader(loc.uri, memtables=[(region, w.memtable.generation, w.memtable_table())])
    finally:
        w.close()
