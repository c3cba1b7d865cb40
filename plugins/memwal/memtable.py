"""The in-memory MemTable of one region: the rows of the current generation, in WAL order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN, newest_per_key
from memwal.schema import conform_to

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

    def conform(self, schema: pa.Schema, old_ids: dict[str, int] | None, new_ids: dict[str, int]) -> None:
        """Take the table's new schema (a column added, renamed or dropped under a live writer): the rows held
        are conformed to it (`memwal.schema.conform_to`, matched by the field ids they were written under)."""
        self.batches = [conform_to(b, schema, new_ids, old_ids or {}) for b in self.batches]
        self.schema = schema

    def is_empty(self) -> bool:
        return not self.batches

    def age_seconds(self) -> float:
        return time.monotonic() - self.created_at if self.batches else 0.0

    def to_table(self) -> pa.Table:
        """Every row written, in WAL order (duplicates included)."""
        if not self.batches:
            return self.schema.empty_table()
        # Puts already conform to the schema (with_tombstone); cast only what does not.
        return pa.concat_tables(
            [b if b.schema.equals(self.schema, check_metadata=True) else b.cast(self.schema) for b in self.batches]
        )

    def flush_rows(self, pk: list[str]) -> tuple[pa.Table, np.ndarray]:
        """Every row written, in WAL order, and the positions (ascending) of those a later row of the same
        primary key supersedes within the generation.

        The flush writes every row in WAL order and masks these with a deletion vector, as Lance core's flush
        does: Lance core's and LanceDB's LSM readers do not deduplicate within one generation, they rely on
        the deletion vector, and probe `_pk_index` (which holds every row) for newer versions.
        """
        rows = self.to_table()
        n = rows.num_rows
        none = np.zeros(0, np.int64)
        if n <= 1:
            return rows, none
        keys = rows.select(pk)
        keys = keys.append_column(GEN_COLUMN, pa.array(np.zeros(n, np.int64)))
        keys = keys.append_column(ROWADDR_COLUMN, pa.array(np.arange(n, dtype=np.uint64)))
        newest = newest_per_key(keys, pk)
        if newest.num_rows == n:
            return rows, none
        live = np.zeros(n, bool)
        live[newest.column(ROWADDR_COLUMN).to_numpy().astype(np.int64)] = True
        return rows, np.flatnonzero(~live)
