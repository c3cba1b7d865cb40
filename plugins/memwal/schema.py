"""Schemas: the `_tombstone` column of WAL entries and flushed generations."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from memwal import naming

__all__ = ["tombstone_schema", "with_tombstone"]


def tombstone_schema(schema: pa.Schema) -> pa.Schema:
    """The base schema plus `_tombstone: bool not null` (WAL entries and flushed generations)."""
    base = pa.schema([f for f in schema if f.name != naming.TOMBSTONE_COLUMN], metadata=schema.metadata)
    return base.append(pa.field(naming.TOMBSTONE_COLUMN, pa.bool_(), nullable=False))


def with_tombstone(table: pa.Table, schema: pa.Schema, tombstone: bool) -> pa.Table:
    """Rows conformed to the base schema plus a constant _tombstone column.

    For deletes (tombstone=True) only the primary key columns need to be present; the rest are NULL.
    Columns that already have the base type are used as they are (no cast): this runs on every put.
    """
    target = tombstone_schema(schema)
    names = set(table.column_names)
    columns = []
    for f in schema:
        if f.name == naming.TOMBSTONE_COLUMN:
            continue
        if f.name in names:
            column = table.column(f.name)
            columns.append(column if column.type == f.type else column.cast(f.type))
        elif tombstone:
            columns.append(pa.nulls(table.num_rows, f.type))
        else:
            raise ValueError(f"column {f.name!r} is missing from the rows written (have {table.column_names})")
    columns.append(pa.array(np.full(table.num_rows, tombstone, dtype=np.bool_)))
    return pa.Table.from_arrays(columns, schema=target)
