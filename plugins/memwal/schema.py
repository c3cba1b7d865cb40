"""Schemas: the `_tombstone` column of WAL entries and flushed generations.

A delete is a row of its key with `_tombstone = true` and nulls elsewhere, so WAL entries and generations
relax every non-key column to nullable (the key keeps its type and nullability), as Lance core's writer does:
a delete on a table with NOT NULL columns must be writable. A put still honours the base's NOT NULL columns.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from memwal import naming
from memwal.field_ids import FIELD_ID_METADATA
from memwal.primary_key import primary_key_columns

__all__ = ["conform_to", "tombstone_schema", "with_field_ids", "with_tombstone"]


def tombstone_schema(schema: pa.Schema) -> pa.Schema:
    """The base schema, non-key columns nullable, plus `_tombstone: bool not null` (WAL entries, generations)."""
    keys = set(primary_key_columns(schema))
    fields = [f if f.name in keys or f.nullable else f.with_nullable(True)
              for f in schema if f.name != naming.TOMBSTONE_COLUMN]
    return pa.schema(fields, metadata=schema.metadata).append(
        pa.field(naming.TOMBSTONE_COLUMN, pa.bool_(), nullable=False))


def with_tombstone(table: pa.Table, schema: pa.Schema, tombstone: bool, where: str = "rows",
                   target: pa.Schema | None = None) -> pa.Table:
    """Rows conformed to `tombstone_schema(schema)` with a constant _tombstone column.

    For deletes (tombstone=True) only the primary key columns need to be present; the rest are NULL. A put
    with a null in a column the base declares NOT NULL is refused (ValueError naming `where` and the column).
    Columns that already have the base type are used as they are (no cast): this runs on every put, so a
    writer passes `target`, its `tombstone_schema(schema)` computed once.
    """
    target = target or tombstone_schema(schema)
    names = set(table.column_names)
    columns = []
    for f in schema:
        if f.name == naming.TOMBSTONE_COLUMN:
            continue
        if f.name in names:
            column = table.column(f.name)
            if not f.nullable and column.null_count:
                raise ValueError(f"{where}: column {f.name!r} is NOT NULL in the base table but "
                                 f"{column.null_count} row(s) written have a null there")
            columns.append(column if column.type == f.type else column.cast(f.type))
        elif tombstone:
            columns.append(pa.nulls(table.num_rows, f.type))
        else:
            raise ValueError(f"{where}: column {f.name!r} is missing from the rows written (have {table.column_names})")
    columns.append(pa.array(np.full(table.num_rows, tombstone, dtype=np.bool_)))
    return pa.Table.from_arrays(columns, schema=target)


def with_field_ids(schema: pa.Schema, ids: Mapping[str, int]) -> pa.Schema:
    """`schema` with each top-level column's Lance field id in its `lance:field_id` metadata (WAL entries)."""
    fields = []
    for f in schema:
        if f.name in ids:
            f = f.with_metadata({**(f.metadata or {}), FIELD_ID_METADATA: str(ids[f.name]).encode()})
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def _ids_in(schema: pa.Schema) -> dict[str, int]:
    out = {}
    for f in schema:
        raw = (f.metadata or {}).get(FIELD_ID_METADATA)
        if raw is not None and raw.isdigit():
            out[f.name] = int(raw)
    return out


def conform_to(table: pa.Table, target: pa.Schema, target_ids: Mapping[str, int] | None = None,
               source_ids: Mapping[str, int] | None = None) -> pa.Table:
    """Rows written under an older schema, in `target`'s columns, as Lance core's replay does: columns are
    matched by Lance field id where both sides know it (a renamed column keeps its values), else by name; a
    column the rows lack (added since) is filled with nulls; one the target lacks (dropped since) is left out.

    `target_ids` / `source_ids`: name -> field id of each side (the source's default: its `lance:field_id`
    metadata, as WAL entries carry); without them, by name (flushed generations: Lance core matches by name too).
    """
    target_ids = target_ids or {}
    if table.schema.equals(target, check_metadata=False):
        return table
    by_id = {i: name for name, i in (_ids_in(table.schema) if source_ids is None else source_ids).items()}
    columns = []
    for f in target:
        name = by_id.get(target_ids[f.name], f.name) if by_id and f.name in target_ids else f.name
        if name in table.column_names:
            columns.append(table.column(name).cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=target)
