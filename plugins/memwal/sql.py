"""SQL literals and predicates for Lance filters built from key values (merge deletes, lookups)."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from memwal.errors import MemWalError

__all__ = ["identifier", "keys_predicate", "literal"]

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def identifier(name: str) -> str:
    return name if _PLAIN.match(name) else "`" + name.replace("`", "``") + "`"


def literal(value: Any) -> str:
    """A SQL literal for a primary-key value (ints, floats, strings, bools, dates, timestamps)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MemWalError(f"primary key value {value!r} cannot be written as a SQL literal")
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.replace(tzinfo=None).isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    raise MemWalError(f"primary key values of type {type(value).__name__} are not supported in deletes")


def keys_predicate(keys: pa.Table, pk: Sequence[str]) -> str | None:
    """A filter matching exactly the given primary keys (None when there are none)."""
    if keys.num_rows == 0:
        return None
    if len(pk) == 1:
        values = ",".join(literal(v) for v in keys.column(pk[0]).to_pylist())
        return f"{identifier(pk[0])} IN ({values})"
    clauses = []
    for row in keys.select(list(pk)).to_pylist():
        clauses.append("(" + " AND ".join(f"{identifier(c)} = {literal(row[c])}" for c in pk) + ")")
    return " OR ".join(clauses)
