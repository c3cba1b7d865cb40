"""The in-memory MemTable of one region: the rows of the current generation, in WAL order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN, newest_per_key

__all__ = ["MemTable"]


@dataclass
class MemTable:
    generation: int
    schema: pa.Schema  # base schema + _tombstone
    batches: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    first_position: int | None = None
    last_position: int | None = None
    created_at: float = field(default_factory=time.monotonic)

    def append(self, table: pa.Table, position: int) -> None:
        if not self.batches:
            self.created_at = time.monotonic()
        self.batches.append(table)
        self.rows += table.num_rows
        self.nbytes += table.nbytes
        if self.first_position is None:
            self.first_position = position
        self.last_position = position

    def is_empty(self) -> bool:
        return not self.batches

    def age_seconds(self) -> float:
        return time.monotonic() - self.created_at if self.batches else 0.0

    def to_table(self) -> pa.Table:
        """Every row written, in WAL order (duplicates included)."""
        if not self.batches:
            return self.schema.empty_table()
        return pa.concat_tables([b.cast(self.schema) for b in self.batches])

    def to_flush_table(self, pk: list[str]) -> pa.Table:
        """The newest row per primary key (tombstones kept), in WAL order.

        Lance core's LSM reader does not deduplicate within one generation: it relies on a flushed
        generation holding each key once, as its own flush writes it.
        """
        rows = self.to_table()
        rows = rows.append_column(GEN_COLUMN, pa.array(np.zeros(rows.num_rows, np.int64)))
        rows = rows.append_column(ROWADDR_COLUMN, pa.array(np.arange(rows.num_rows, dtype=np.uint64)))
        newest = newest_per_key(rows, pk)
        newest = newest.take(pc.sort_indices(newest, sort_keys=[(ROWADDR_COLUMN, "ascending")]))
        return newest.drop_columns([GEN_COLUMN, ROWADDR_COLUMN])
