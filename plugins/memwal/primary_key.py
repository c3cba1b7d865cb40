"""A table's unenforced primary key, read from field metadata by Lance's rule (pylance 14).

A top-level column is in the key if it carries `lance-schema:unenforced-primary-key` = "true" or
`lance-schema:unenforced-primary-key:position` (LanceDB writes only the position, e.g. "1"). Columns with
a positive position come first, in ascending position; columns with only the boolean marker (or
position 0) come after them, in field order.

Where Lance silently guesses, we refuse with one error naming the table and the columns (nothing is
read or written under a key the user did not mean):
- a position that is not a non-negative decimal integer ("abc", "-1", "1.5"): Lance drops the column
  from the key without a word;
- the same positive position on two columns: Lance accepts it and the key order is then arbitrary;
- the boolean marker "false" together with a position: Lance takes the column, the marker says no;
- a boolean marker that is neither "true" nor "false" (case-insensitive).

A key value is never null: the newest-wins rule has no answer for it (a null equals nothing, or every other
null). Lance 14 refuses a nullable key column when it writes a table, yet a table it wrote may still have one
(a `:position` of " 1" is a key to its MemWAL writer and not to that check); our writer refuses null keys and
a reader refuses a table whose base or generations hold one (`refuse_null_keys`, `refuse_null_base_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from memwal import naming
from memwal.errors import BadInputError, InvalidPrimaryKeyError, NoPrimaryKeyError

if TYPE_CHECKING:
    import lance

__all__ = ["primary_key_columns", "refuse_null_base_keys", "refuse_null_keys"]


def _position(name: str, raw: bytes, where: str) -> int:
    text = raw.decode(errors="replace").strip()
    if not text.isdigit():  # rejects "", "-1", "+1", "1.5", "abc"
        raise InvalidPrimaryKeyError(
            f"{where}: column {name!r} has {naming.PRIMARY_KEY_POSITION_METADATA.decode()}={text!r}, which is "
            f"not a non-negative integer: set it to the column's 1-based place in the key (or remove it)"
        )
    return int(text)


def _marker(name: str, raw: bytes, where: str) -> bool:
    text = raw.decode(errors="replace").strip().lower()
    if text not in ("true", "false"):
        raise InvalidPrimaryKeyError(
            f"{where}: column {name!r} has {naming.PRIMARY_KEY_METADATA.decode()}={text!r}: "
            f"set it to 'true' (or remove it)"
        )
    return text == "true"


def primary_key_columns(schema: pa.Schema, where: str = "schema") -> list[str]:
    """The key columns, in key order (positioned columns by position, then marked ones in field order)."""
    positioned: dict[int, str] = {}
    unpositioned: list[str] = []
    for f in schema:
        meta = f.metadata or {}
        marker = meta.get(naming.PRIMARY_KEY_METADATA)
        raw_position = meta.get(naming.PRIMARY_KEY_POSITION_METADATA)
        marked = _marker(f.name, marker, where) if marker is not None else None
        position = _position(f.name, raw_position, where) if raw_position is not None else None
        if marked is False and position is not None:
            raise InvalidPrimaryKeyError(
                f"{where}: column {f.name!r} has {naming.PRIMARY_KEY_METADATA.decode()}='false' but also "
                f"{naming.PRIMARY_KEY_POSITION_METADATA.decode()}={position}: remove one of the two"
            )
        if position:
            if position in positioned:
                raise InvalidPrimaryKeyError(
                    f"{where}: columns {positioned[position]!r} and {f.name!r} both have primary key "
                    f"position {position}: give each key column its own position"
                )
            positioned[position] = f.name
        elif marked or position == 0:
            unpositioned.append(f.name)
    pk = [positioned[p] for p in sorted(positioned)] + unpositioned
    if not pk:
        raise NoPrimaryKeyError(
            f"{where} has no primary key: mark the key column(s) with field metadata "
            f"{naming.PRIMARY_KEY_METADATA.decode()}='true' or "
            f"{naming.PRIMARY_KEY_POSITION_METADATA.decode()}='1', '2', ... (columns: {schema.names})"
        )
    return pk


def _null_key_error(where: str, column: str, count: int) -> BadInputError:
    return BadInputError(f"{where}: primary key column {column!r} has {count} null value(s); a key must not be "
                         "null (which row is the newest version of a null key is undefined)")


def refuse_null_keys(rows: pa.Table, pk: Sequence[str], where: str) -> None:
    """BadInputError naming `where` (table, region, generation) and the column if a key column of `rows` holds a
    null (columns `rows` lacks are left to the caller's own check)."""
    for c in pk:
        if c in rows.column_names and rows.column(c).null_count:
            raise _null_key_error(where, c, rows.column(c).null_count)


def refuse_null_base_keys(ds: lance.LanceDataset, pk: Sequence[str], where: str) -> None:
    """BadInputError naming `where` and the column if the base table holds a row with a null key. Only a key
    column the schema lets be null is read (one filtered count); a NOT NULL one costs nothing."""
    for c in pk:
        if ds.schema.field(c).nullable:
            count = ds.count_rows(filter=pc.field(c).is_null())
            if count:
                raise _null_key_error(where, c, count)
