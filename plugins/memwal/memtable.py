"""The in-memory MemTable of one region: the rows of the current generation, in WAL order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pyarrow as pa

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
        if not self.batches:
            return self.schema.empty_table()
        return pa.concat_tables([b.cast(self.schema) for b in self.batches])
